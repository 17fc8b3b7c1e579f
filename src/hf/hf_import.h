// Import of a Hugging Face folder (GPT-2, Llama, BLOOM) as a keel checkpoint, to continue
// pretraining a published model (docs/hugging-face.md). config.json becomes keel's model shape
// (hf/hf_config.h refuses what keel cannot compute), every HF tensor goes back through the
// inverse of the export's layout change (hf/hf_arch.h), the vocabulary is padded to keel's
// with zero rows, and the result is written by the same writer as training: a run directory
// holding iter_0000000 (weights, zero Adam moments, the model's config) that `keel ckpt verify`
// passes and `keel train --load` starts from as --finetune does.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_store.h"
#include "config/train_config.h"
#include "core/env.h"
#include "core/status.h"
#include "hf/hf_arch.h"
#include "hf/hf_config.h"
#include "hf/hf_tokenizer_files.h"
#include "model/gpt.h"

namespace keel {

// The run directory file with the imported model's shape as a --config file.
constexpr const char* kImportModelToml = "model.toml";

struct HfImportOptions {
  HfConfigOptions config;       // --max-position-embeddings
  std::string gpt2_assets_dir;  // to recognise GPT-2 tokenizer files; empty: the npm assets
};

struct HfImportReport {
  std::string hf_dir;
  std::string out_dir;
  std::string checkpoint_dir;  // out_dir/iter_0000000
  HfArch arch = HfArch::kGpt2;
  std::vector<std::string> weight_files;
  std::set<std::string> dtypes;    // of the tensors read
  size_t num_tensors = 0;          // HF tensors read
  int vocab = 0;                   // V
  int padded_vocab = 0;            // keel's Vp: V plus zero rows
  CheckpointTokenizer tokenizer;   // kind "none" when the folder has no tokenizer keel uses
  std::string tokenizer_note;      // why, then
  std::vector<std::string> notes;  // keel's choices and what it left out, for `note:` lines
  std::string model_flags;         // the model's `keel train` flags
  uint64_t bytes = 0;              // of the checkpoint
};

// Imports the folder `hf_dir` into the new run directory `out_dir` (written as `out_dir`.tmp and
// renamed). InvalidArgument (nothing written) for what keel cannot represent, naming it, and for
// an `out_dir` that exists and is not empty; Corruption for damaged or inconsistent files (a
// missing or misshapen tensor, one keel's model has no place for, NaN or Inf weights).
Status ImportHf(Env* env, const std::string& hf_dir, const std::string& out_dir,
                const HfImportOptions& options, const CheckpointStore::Logger& log,
                HfImportReport* report);

// The config of a run of the model `spec` (vocab V; padded by Validate) with tokenizer `tok`:
// its model settings (Megatron's flags), keel's defaults for the rest, validated.
Status TrainConfigForSpec(const GptSpec& spec, const CheckpointTokenizer& tok, TrainConfig* cfg,
                          std::vector<std::string>* notes);
// The model settings of `cfg` (its shape, without seq-length) as TOML lines (every one) and as
// `keel train` flags (those that differ from keel's defaults).
std::string ModelToml(const TrainConfig& cfg);
std::string ModelFlags(const TrainConfig& cfg);

// What an import writes, from a model in memory: the run directory `out_dir` (as `out_dir`.tmp,
// then one rename) with checkpoint iter_0000000 of `model` (config `cfg`, cfg.model ==
// the model's) and zero Adam moments, its state.json marked with `provenance` under
// kImportStateKey, and model.toml. Used by ImportHf, and by tests to make checkpoints of models
// built in memory.
Status WriteImportedCheckpoint(Env* env, const std::string& out_dir, const TrainConfig& cfg,
                               GptModel* model, const CheckpointTokenizer& tok,
                               const nlohmann::json& provenance, const CheckpointStore::Logger& log,
                               uint64_t* bytes);

}  // namespace keel

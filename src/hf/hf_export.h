// Export of a keel checkpoint as a Hugging Face folder (docs/hugging-face.md): config.json,
// model.safetensors with HF names and layouts, and the tokenizer files transformers loads. The
// architecture follows the model (hf/hf_arch.h): GPT-2 (GPT2LMHeadModel), Llama
// (LlamaForCausalLM) or BLOOM (BloomForCausalLM); a model none of them represents is refused,
// naming the feature, and nothing is written. The folder gives keel's logits over the real
// vocabulary (keel's padding rows are dropped).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint_store.h"
#include "checkpoint/safetensors.h"
#include "core/env.h"
#include "core/status.h"
#include "hf/hf_arch.h"
#include "model/gpt.h"

namespace keel {

// The HF tensors of a model whose keel tensors `keel` holds (host fp32, by keel name with keel
// shapes), in HF's order. Re-laid-out copies live in `storage`, which must outlive the returned
// views; the other views point into `keel`'s memory. Corruption names a missing tensor or a wrong
// shape.
Status ConvertToHf(HfArch arch, const GptSpec& spec, const std::map<std::string, TensorView>& keel,
                   std::vector<std::vector<float>>* storage, std::vector<TensorView>* out);

struct HfExportOptions {
  std::string gpt2_assets_dir;  // encoder.json and vocab.bpe; empty: DefaultGpt2AssetsDir()
};

struct HfExportReport {
  std::string checkpoint_dir;  // the iter_N directory that was exported
  std::string out_dir;
  HfArch arch = HfArch::kGpt2;
  std::vector<std::pair<std::string, uint64_t>> files;  // name inside out_dir, bytes
  size_t num_tensors = 0;
  int vocab = 0;         // V, rows of the embedding and config vocab_size
  int padded_vocab = 0;  // keel's Vp, sliced to V
  std::string tokenizer_kind;
  bool wrote_tokenizer = false;
  std::string tokenizer_note;  // why no tokenizer files were written, when none were
};

// Exports `checkpoint_path` (an iter_N directory, or a run directory: its newest valid checkpoint)
// to `out_dir`, written as `out_dir`.tmp and renamed into place. InvalidArgument (nothing written)
// when the model is not representable, when `out_dir` exists and is not an empty directory, or
// when `out_dir`.tmp exists (an interrupted export: remove it).
Status ExportHf(Env* env, const std::string& checkpoint_path, const std::string& out_dir,
                const HfExportOptions& options, const CheckpointStore::Logger& log,
                HfExportReport* report);

// An output folder as export and import write it (OUT.tmp, then one rename): `out` must not exist
// or be an empty directory (rename(2) replaces only that), and `out`.tmp must not exist (an
// interrupted run left it: the user removes it). InvalidArgument naming `command` otherwise.
Status CheckNewOutputDir(Env* env, const std::string& out, const std::string& command);

}  // namespace keel

// What a checkpoint of a training run holds, and how the loop writes, reads and resumes it.
//
//   iter_N/model.safetensors      fp32 master weights by Megatron name (topology-free; a tensor
//                                 or pipeline parallel run writes one file per (tp, pp) position
//                                 instead: checkpoint/tensor_pieces.h)
//   iter_N/optimizer.safetensors  AdamW moments: exp_avg.<name>, exp_avg_sq.<name> (written by N
//                                 data-parallel ranks: optimizer.rank-R-of-N.safetensors, each
//                                 rank's shard; checkpoint/optimizer_shards.h)
//   iter_N/state.json             counters (iteration, consumed samples = data cursor and schedule
//                                 position), optimizer step and hyper-parameters, scheduler and
//                                 ramp-up position, LR scale, RNG keys, data order, metrics cursor,
//                                 guard state, model shape, tokenizer, config hash, keel version,
//                                 and the history of deliberate changes
//   iter_N/config.toml            the resolved config (loadable with --config)
//   iter_N/tokenizer.model        the SentencePiece model, when that tokenizer was used
//   iter_N/tokenizer.json, tokenizer_config.json, special_tokens_map.json
//                                 a Hugging Face tokenizer's files (--tokenizer-type
//                                 PretrainedFromHF)
//   iter_N/gpt2-vocab.json, gpt2-merges.txt
//                                 Megatron's --vocab-file and --merge-file
//
// Randomness is counter-based (Philox keyed by seed, purpose and position), so the RNG state of a
// run is its seed plus the counters above: nothing else has to be captured for bit-exact resumes.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_store.h"
#include "checkpoint/train_state.h"
#include "config/config.h"
#include "core/env.h"
#include "data/indexed_dataset.h"
#include "data/tokenizer.h"
#include "model/gpt.h"
#include "optim/adamw.h"

namespace keel {

// Run-level facts recorded beside the trainer's state.
struct RunInfo {
  std::string data_path;  // resolved dataset prefix (the default corpus's when none was given);
                          // of a mixture, its first dataset's first shard
  DatasetMeta meta;       // tokenizer of the data
  nlohmann::json datasets = nlohmann::json::array();  // [{name, prefix, shards, weight}]
};

// What a checkpoint of a training run is made of: the tensors of the model and optimizer, the
// TrainState, and where the schedule stands (recorded for readers; a resume recomputes it).
struct TrainCheckpointSource {
  const TrainConfig* config = nullptr;
  GptModel* model = nullptr;
  AdamW* optimizer = nullptr;
  TrainState state;
  double next_lr = 0;
  int64_t next_global_batch = 0;
  // Data parallel: this rank and the world size (each rank writes its shard of the moments, rank 0
  // everything else), and whether the optimizer is sharded (ZeRO-1; recorded in state.json).
  // Tensor parallel: rank/world are the data-parallel rank and size, and the model holds the
  // slices of tensor rank `tensor_rank` of `tensor`; the files are tensor_pieces.h's.
  int rank = 0;
  int world = 1;
  bool sharded = false;
  int tensor_rank = 0;
  int tensor = 1;
  // Pipeline parallel: the model holds stage `pipeline_rank` of `pipeline` (its tied embedding
  // copy is not written: the first stage's is).
  int pipeline_rank = 0;
  int pipeline = 1;
};

// Host views (Backend::ViewOnHost) of the tensors a checkpoint's files point at: the weights and
// this rank's moments. On the CPU backend they are the model's and optimizer's memory itself
// (zero-copy), which must then not change until the files are written.
// With `copy` (--async-save) they are copies instead, in buffers kept between saves (allocated at
// the first), so the loop may train on while a background thread writes the files.
struct CheckpointStaging {
  HostView params, exp_avg, exp_avg_sq;
  bool copy = false;
  // With `copy`: where the live memory is host memory (the CPU backend), the copies are only
  // listed in `deferred`, for the background writer to make while the loop computes the next
  // iteration's gradients; the loop must then not change the weights or moments before they are
  // made (CheckpointController::WaitForSnapshot, before the next update).
  bool defer = false;
  struct DeferredCopy {
    const float* from = nullptr;
    float* to = nullptr;
    size_t n = 0;
  };
  std::vector<DeferredCopy> deferred;
  std::vector<float> params_copy, exp_avg_copy, exp_avg_sq_copy;
  // Bytes the copies hold for a model of `params` parameters whose optimizer holds `moments`
  // elements of each moment (the memory estimate counts them).
  static uint64_t CopyBytes(uint64_t params, uint64_t moments) {
    return (params + 2 * moments) * sizeof(float);
  }
};

// The files of a checkpoint of `src` that rank src.rank writes (all of them for one process).
// Tensor data is read through `staging`, which must outlive the returned files. `guard_state`
// (the guard's windows, open event and budget) goes into state.json's "guard".
Status BuildTrainCheckpoint(Env* env, const TrainCheckpointSource& src, const RunInfo& run,
                            const nlohmann::json& history, CheckpointStaging* staging,
                            std::vector<CheckpointFile>* out,
                            const nlohmann::json& guard_state = nullptr);

// state.json's key that marks a checkpoint written by an import (hf/hf_import.h): weights without
// a training run behind them, which `keel train --load` loads as --finetune does.
constexpr const char* kImportStateKey = "import";

// A checkpoint's state.json and config, parsed.
struct SavedTrainState {
  std::string dir;
  nlohmann::json state;  // state.json
  TrainConfig config;    // config.toml, resolved as it was saved
  std::string config_text;
  GptSpec spec;
  TrainState train;      // counters, optimizer step, LR scale, skipped windows, metrics cursor
  nlohmann::json guard;  // state.json "guard" (null when the guard was off)
  nlohmann::json history = nlohmann::json::array();
};
Status ReadSavedTrainState(Env* env, const std::string& dir, SavedTrainState* out);
// Verifies checkpoint directory `dir` completely (manifest, sizes, checksums) and reads it.
Status ReadVerifiedCheckpoint(Env* env, const std::string& dir, SavedTrainState* out);

// The model shape recorded in state.json, and back.
nlohmann::json SpecToJson(const GptSpec& s);
Status SpecFromJson(const nlohmann::json& j, const std::string& where, GptSpec* out);

// The refusal of checkpoint `dir` whose weights hold NaN or Inf (`nf`): saved after its run
// diverged (by a keel that did not yet stop such runs), it must never be trained on, sampled or
// exported silently. `refused` says what was refused ("load"), `instead` the command to run on
// an older checkpoint, where RUN/ stands for `dir`'s run directory. Corruption: exit 1.
Status NonFiniteWeightsError(const std::string& dir, const NonFiniteParams& nf,
                             const std::string& refused, const std::string& instead);

// Loads the weights and Adam moments of `saved`'s directory into `model` and `optimizer` (the
// TrainState, saved.train, is the caller's to restore). Every tensor must be present with the
// model's exact name, shape and dtype, and nothing else may be there; weights holding NaN or Inf
// are refused (NonFiniteWeightsError).
Status LoadCheckpointTensors(Env* env, const SavedTrainState& saved, GptModel* model,
                             AdamW* optimizer);

// Loads the weights of checkpoint `dir`, saved at any layout, into `model` (whole tensors; the
// directory verified already). Every tensor must be there with the model's exact name and shape,
// and nothing else; NaN and Inf are the caller's to check.
Status LoadCheckpointWeights(Env* env, const std::string& dir, GptModel* model);

// For `keel sample` and tools: the model (weights only) and tokenizer of a checkpoint directory.
// `path` is a checkpoint directory or a run directory (its newest valid checkpoint is used).
// Weights holding NaN or Inf are refused (NonFiniteWeightsError).
struct LoadedModel {
  std::string checkpoint_dir;
  SavedTrainState saved;
  std::unique_ptr<GptModel> model;
  std::unique_ptr<Tokenizer> tokenizer;
};
Status LoadModelFromCheckpoint(Env* env, const std::string& path, Backend* backend,
                               const CheckpointStore::Logger& log, LoadedModel* out);

}  // namespace keel

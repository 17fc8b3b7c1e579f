// TrainConfig: every setting of a run, with Megatron-LM's flag names and meanings, as a plain
// value. Most modules need only this header; reading flags and TOML files, validating and printing
// a config is config/config.h. The built-in defaults are the default job (a small GPT on the
// embedded Moby-Dick corpus); examples/default.toml spells them out.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "config/model_shape.h"
#include "core/precision.h"

namespace keel {

// Activation recomputation (model/gpt.h): none, the attention probabilities, or whole layers.
enum class Recompute { kNone, kSelective, kFull };
enum class RecomputeMethod { kUniform, kBlock };
enum class LrDecayStyle { kConstant, kLinear, kCosine };
enum class InitMethod { kNormal, kSmallInit, kMegatron530B };
enum class TokenizerKind { kGpt2, kSentencePiece };
enum class GuardLevel { kOff, kObserve, kAct };
// What the guard does about a slow divergence its trend test found (docs/guard.md).
enum class GuardDivergence { kNotify, kAct };

// The most tokens one generated sample may have: `keel train --sample-tokens` and
// `keel sample --tokens` share this cap.
inline constexpr int kMaxSampleTokens = 100000;

// The largest learning rate keel accepts (--lr, and --lr times an LR scale). AdamW moves every
// weight by about the LR per step, so rates far above 1 only destroy the model; 10 leaves room
// for any deliberate experiment (GPT-2 small trains at 6e-4).
inline constexpr double kMaxLearningRate = 10;

struct TrainConfig {
  // ---- model ----
  // The model's shape (config/model_shape.h): what GptModel is built from, with the vocabulary
  // and EOD of the data filled in by Validate's caller and the padded vocabulary by Validate.
  GptSpec model;
  int seq_length = 128;
  int make_vocab_size_divisible_by = 128;
  // > 0: the vocabulary is padded to exactly this many rows (Megatron-DeepSpeed's flag; BLOOM:
  // 250880), instead of up to a multiple of make_vocab_size_divisible_by.
  int pad_vocab_size_to = 0;
  InitMethod init_method = InitMethod::kNormal;
  float init_method_std = 0.02f;  // used by kNormal; the named methods derive std from hidden size

  // Activation recomputation: Megatron-LM's --recompute-granularity (--recompute-activations is
  // selective; Megatron-DeepSpeed's --checkpoint-activations is full). Not part of the model's
  // shape: free to change on resume.
  Recompute recompute_granularity = Recompute::kNone;
  // With full: Megatron-LM's --recompute-method and --recompute-num-layers. block N recomputes
  // the first N layers only (less compute, more memory); uniform recomputes every layer (keel
  // keeps each layer's input, so any uniform chunk size recomputes one layer at a time).
  RecomputeMethod recompute_method = RecomputeMethod::kUniform;
  int recompute_num_layers = 1;
  // The model's count of layers that recompute their forward (GptModel::set_recompute): -1 all.
  int full_recompute_layers() const {
    return recompute_method == RecomputeMethod::kBlock ? recompute_num_layers : -1;
  }

  // ---- batch and length ----
  int micro_batch_size = 8;
  int global_batch_size = 16;              // 0: micro_batch_size * data_parallel_size
  std::vector<int64_t> rampup_batch_size;  // empty, or {start, increment, ramp-up samples}
  int data_parallel_size = 1;              // world / (tensor x pipeline); not a flag
  // From a DeepSpeed config's gradient_accumulation_steps, not a flag (0: none): the global
  // batch must be micro-batch x data-parallel size x this, and is that when not given.
  int gradient_accumulation_steps = 0;
  int64_t train_iters = 400;  // exactly one of train_iters / train_samples is > 0
  int64_t train_samples = 0;

  // ---- learning rate ----
  double lr = 2e-3;
  double min_lr = 2e-4;
  LrDecayStyle lr_decay_style = LrDecayStyle::kCosine;
  int64_t lr_warmup_samples = 0;
  int64_t lr_warmup_iters = 40;
  int64_t lr_decay_samples = 0;  // 0: train_samples (samples-based runs)
  int64_t lr_decay_iters = 0;    // 0: train_iters (iteration-based runs)

  // ---- optimizer ----
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.95;
  double adam_eps = 1e-8;
  double weight_decay = 0.1;
  double clip_grad = 1.0;  // 0 disables clipping

  // ---- mixed precision (docs/mixed-precision.md) ----
  // The recipe: set by Validate from the flags below (or, when neither is set, it sets them from
  // this field, so code that fills a TrainConfig may name the precision directly).
  Precision precision = Precision::kFp32;
  bool bf16 = false;  // --bf16 (Megatron's flag)
  bool fp16 = false;  // --fp16
  // fp16's loss scaler (Megatron's flags and defaults); ignored, with a note, in fp32 and bf16.
  // 2^16, DeepSpeed's default (initial_scale_power 16). Megatron starts at 2^32 and spends the
  // run's first ~16 iterations halving it (each overflow skips an update); pass
  // --initial-loss-scale 4294967296 for Megatron's start.
  double initial_loss_scale = 65536.0;
  double min_loss_scale = 1.0;
  int64_t loss_scale_window = 1000;  // clean iterations before the scale doubles
  int64_t hysteresis = 2;            // overflows absorbed before the scale halves
  double loss_scale = 0;             // > 0: a static scale instead of the dynamic one

  // ---- tensor parallel (docs/distributed.md) ----
  // Megatron-LM's --tensor-model-parallel-size T: the world's ranks form groups of T adjacent
  // ranks, each holding a slice of every split tensor; the data-parallel size is world / T.
  int tensor_model_parallel_size = 1;
  bool sequence_parallel = false;  // Megatron-LM's --sequence-parallel (needs T > 1 to matter)

  // ---- pipeline parallel (docs/pipeline.md) ----
  // Megatron-LM's --pipeline-model-parallel-size P: the layers cut into P stages, each on its
  // own ranks (tensor ranks adjacent, then data, then pipeline); the data-parallel size is
  // world / (T P). --num-layers-per-virtual-pipeline-stage (0: one chunk per stage) interleaves
  // V = layers / (P x it) chunks per stage; --pp-partition-method is Megatron-DeepSpeed's
  // (pipeline/stage_partition.h; "": Megatron-LM's split).
  int pipeline_model_parallel_size = 1;
  int num_layers_per_virtual_pipeline_stage = 0;
  std::string pp_partition_method;

  // ---- data parallel (docs/distributed.md) ----
  bool use_distributed_optimizer = true;  // ZeRO-1: Adam moments sharded over the ranks
  bool overlap_grad_reduce = true;        // reduce gradient buckets during backward
  int64_t ddp_bucket_size = 1 << 20;      // elements per gradient bucket

  // ---- no limbo: watchdog, collective checks, stragglers, replicas (docs/distributed.md) ----
  // A phase of the loop that lasts longer than its limit is a hang: every rank dumps its state
  // to SAVE/hangs/iter_N/ and the job exits 4. 0 turns the watchdog off.
  double distributed_timeout_minutes = 10;      // any phase (Megatron's flag)
  double first_iteration_timeout_minutes = 30;  // startup and this process's first iteration
  double save_timeout_minutes = 30;             // a checkpoint save
  double eval_timeout_minutes = 30;             // an evaluation
  bool debug_collectives = false;               // agree on kind and size before every collective
  int64_t check_replicas_interval = 100;  // iterations between replica hashes (0: only at saves)
  int64_t straggler_window = 10;          // iterations per straggler window (0: off)
  double straggler_threshold = 0.03;      // slower than the reference by this fraction

  // ---- run ----
  uint64_t seed = 1234;
  int64_t eval_interval = 100;
  int64_t eval_iters = 8;
  int64_t log_interval = 10;
  int threads = 0;              // 0: all cores; at most MaxThreads() (config/config.h)
  std::string backend = "cpu";  // backend/registry.h

  // ---- data ----
  // Megatron indexed dataset prefixes: "PREFIX", or a mixture "W1 PREFIX1 W2 PREFIX2 ..."
  // (Megatron's syntax); empty: the default corpus.
  std::vector<std::string> data_path;
  std::string split = "969,30,1";  // train,valid,test weights over documents
  TokenizerKind tokenizer = TokenizerKind::kSentencePiece;  // default corpus only
  // The vocabulary and EOD of the dataset's metadata are model.vocab and model.eod_id; packed
  // documents (--reset-position-ids / --reset-attention-mask) are the model's too.
  // Megatron's tokenizer flags (data/megatron_tokenizer.h): the tokenizer of datasets without
  // keel metadata (those Megatron's tools wrote), checked against the metadata of those with it.
  // tokenizer_type: "" (none), GPT2BPETokenizer, SentencePieceTokenizer or PretrainedFromHF.
  std::string tokenizer_type;
  std::string vocab_file, merge_file;  // GPT2BPETokenizer
  std::string tokenizer_model;         // SentencePieceTokenizer
  std::string tokenizer_name_or_path;  // PretrainedFromHF: a local Hugging Face tokenizer folder
  // Megatron-DeepSpeed's dataset groups instead of --data-path (data/weighted_split_paths.h):
  // "NAME: W1 START:END PREFIX1, W2 START:END PREFIX2" each; one train group, any number of
  // validation groups, each evaluated on its own. The *_path forms name a file of them (BLOOM's
  // train-splits.txt), read when the flags are parsed, so the groups themselves are the config.
  std::vector<std::string> train_weighted_split_paths, valid_weighted_split_paths;
  std::string train_weighted_split_paths_path, valid_weighted_split_paths_path;
  // Threads reading training samples ahead of the loop (Megatron's --num-workers); 0: read on the
  // loop's own thread.
  int num_workers = 1;

  // ---- checkpoints and stopping ----
  std::string save;  // run directory: checkpoints (iter_NNNNNNN/), marker, the run's journal
  std::string load;  // checkpoints to start from (empty: resume from --save if it has any)
  // Megatron's --finetune: only the model weights of --load (fresh optimizer, iteration 0, this
  // run's schedule and data); a checkpoint imported from Hugging Face always loads so.
  bool finetune = false;
  int64_t save_interval = 100;       // iterations between checkpoints (0: only final and on stop)
  double save_interval_minutes = 0;  // also save when this much time passed since the last (0: off)
  int keep_last_checkpoints = 2;     // retention: newest K committed checkpoints (0: keep all)
  // Megatron's --async-save: periodic saves snapshot the state and write it on a background
  // thread while training goes on (docs/checkpoints.md).
  bool async_save = false;
  // Megatron's non-persistent (local) checkpoints (docs/checkpoints.md, "Local tier"): every N
  // iterations each rank writes its piece to node-local DIR and a replica of its neighbour's;
  // resumes take the newest valid across both tiers. 0: off. keel has the type "local" only.
  int64_t non_persistent_save_interval = 0;
  std::string non_persistent_ckpt_type = "local";
  std::string non_persistent_local_ckpt_dir;
  std::string kill_switch_path;      // when this file appears: save, then exit 0
  int64_t exit_interval = 0;         // save and exit once iteration % N == 0 (0: off)
  double exit_duration_in_mins = 0;  // save and exit after this long in this process (0: off)
  // Deliberate changes against a checkpoint (refused otherwise, with a diff).
  bool override_scheduler = false;   // accept new LR/warmup/decay/optimizer/batch settings
  bool override_data_order = false;  // accept a new seed, data path or split
  double lr_scale_on_resume = 0;     // multiply the schedule's LR by this from now on (0: keep)

  // ---- guard (docs/guard.md) ----
  GuardLevel guard = GuardLevel::kAct;  // off | observe (journal only) | act
  double guard_z_threshold = 6;         // loss spike: robust z-score above this
  double guard_grad_z_threshold = 10;   // gradient-norm spike
  int guard_window = 100;               // iterations in the robust windows
  int guard_min_history = 20;           // no spike detection before this many normal iterations
  int guard_divergence_window = 50;     // iterations whose median loss is compared ...
  double guard_divergence_rel = 0.05;   // ... with the lowest level: diverging above (1 + this)
  // The trend test (guard/loss_trend_detector.h): notify (journal, log, notification) or act
  // (roll back before its start, skip the data since, cut the LR).
  GuardDivergence guard_divergence = GuardDivergence::kNotify;
  double guard_trend_z = 3.75;        // its threshold (z of the rise; higher with dense records)
  int guard_max_skips = 3;            // anomalous updates skipped in a row before a rollback
  int guard_max_data_skips = 50;      // ... when the batches are the anomaly, not the weights
  double guard_attn_logit_max = 100;  // leading indicator: cut the LR past this (0: off)
  int guard_max_lr_cuts = 3;          // ... at most this many times
  int guard_recover_iters = 50;       // not back at the pre-onset level after this: roll back
  int guard_rollback_margin = 1;      // roll back to a checkpoint at least this before the onset
  int guard_skip_before = 5;          // data window skipped: iterations before the onset ...
  int guard_skip_after = 50;          // ... and after it
  double guard_lr_cut = 0.5;          // LR factor of the second rung of the ladder
  int guard_max_rollbacks = 4;        // then stop with a report
  int guard_escalation_window = 500;  // a rollback this close to the previous one escalates
  // Iterations whose data is skipped (read past, no update): "A-B" inclusive ranges (Megatron's
  // --skip-train-iteration-range).
  std::vector<std::string> skip_train_iteration_range;
  // Samples whose iterations are skipped the same way: "A-B" inclusive positions in the run's
  // sample stream (0-based, as consumed samples count them); every iteration that reads one of
  // them is skipped whole.
  std::vector<std::string> skip_train_samples_range;

  // ---- DeepSpeed's config (Megatron-DeepSpeed's --deepspeed --deepspeed_config FILE) ----
  // Read when the flags are parsed (config/deepspeed_config.h): what keel supports is applied to
  // the settings above, the rest is named in a note.
  bool deepspeed = false;
  std::string deepspeed_config;

  // ---- output ----
  // TensorBoard event files go here (default: SAVE/tensorboard); Megatron's switches add the
  // timers (iteration-time/, time/), the batch size and the validation perplexity.
  std::string tensorboard_dir;
  bool log_timers_to_tensorboard = false;
  bool log_batch_size_to_tensorboard = false;
  bool log_validation_ppl_to_tensorboard = false;
  int sample_tokens = 64;  // tokens generated at the end of training (0: none; kMaxSampleTokens)
  std::string sample_prompt = "Call me";

  // Standard deviation actually used for initialisation.
  float ResolvedInitStd() const {
    const double h = model.hidden;
    switch (init_method) {
      case InitMethod::kSmallInit:
        return static_cast<float>(std::sqrt(2.0 / (5.0 * h)));
      case InitMethod::kMegatron530B:
        return static_cast<float>(std::sqrt(1.0 / (3.0 * h)));
      case InitMethod::kNormal:
        break;
    }
    return init_method_std;
  }
};

}  // namespace keel

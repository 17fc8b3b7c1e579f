#include "train/memory_estimate.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "data/sample_prefetcher.h"
#include "model/gpt.h"
#include "pipeline/pipeline_step.h"
#include "pipeline/schedule.h"
#include "pipeline/stage_partition.h"

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

namespace {

// A pipeline stage's share of the run: its chunks' parameters, the activations its chunks hold,
// the boundary buffers, and its layers for messages.
struct StageShare {
  uint64_t params = 0, activations = 0, boundary = 0;
  int held = 0;
  std::string layers;
};

// The stage partition the trainer builds (PartitionStages; V chunks per stage when interleaved).
// False when the config cannot be split (keel plan prices layouts before validating them).
bool PipelineParts(const TrainConfig& cfg, int P, int* V, std::vector<StageLayers>* parts) {
  const int per = cfg.num_layers_per_virtual_pipeline_stage;
  *V = per > 0 ? std::max(1, cfg.model.num_layers / (P * per)) : 1;
  const PartitionModel model = PartitionModelOf(cfg.model);
  return PartitionStages(cfg.pp_partition_method, model, P, *V, parts).ok() ||
         PartitionStages("", model, P, *V, parts).ok();
}

StageShare StageShareOf(const TrainConfig& cfg, int P, int V, const std::vector<StageLayers>& parts,
                        int stage, int64_t micro) {
  const GptSpec& spec = cfg.model;
  const int tensor = std::max(1, cfg.tensor_model_parallel_size);
  const bool sp = cfg.sequence_parallel && tensor > 1;
  auto count = [&](const ModelStage& m) {
    uint64_t n = 0;
    for (const ParamInfo& p : GptModel::ParamLayout(spec, tensor, m)) n += p.numel;
    return n;
  };
  // One layer standing for all (a stage of a billion layers is counted, not listed).
  const uint64_t per_layer = count(ModelStage{0, 1, false, false});
  // The micro-batches each chunk holds at once: the schedule's forwards not yet backwarded, as
  // RunPipelineStep lays out a slot of activations for each.
  std::vector<int> held(static_cast<size_t>(V), 0), peak(static_cast<size_t>(V), 0);
  for (const PipeAction& a : ComputeOrder(P, static_cast<int>(micro), V, stage)) {
    if (a.op == PipeOp::kForward) {
      peak[a.chunk] = std::max(peak[a.chunk], ++held[a.chunk]);
    } else if (a.op == PipeOp::kBackward) {
      --held[a.chunk];
    }
  }
  StageShare out;
  for (int c = 0; c < V; ++c) {
    ModelStage m = ModelStageOf(parts, P, stage, c);
    const int layers = m.last_layer - m.first_layer;
    ModelStage outside = m;
    outside.last_layer = outside.first_layer;
    out.params += count(outside) + per_layer * static_cast<uint64_t>(layers);
    GptSpec local = spec;
    local.num_layers = layers;
    out.activations += static_cast<uint64_t>(peak[c]) *
                       GptModel::ActivationBytes(local, cfg.micro_batch_size, cfg.seq_length,
                                                 cfg.precision, cfg.recompute_granularity,
                                                 cfg.full_recompute_layers(), tensor, sp, m.head);
    out.held += peak[c];
    if (c > 0) out.layers += ", ";
    out.layers += m.Describe(spec.num_layers);
  }
  // The executor's boundary tensors in flight (one received, one waiting for its send), and the
  // tied embedding gradient the first and last stage exchange.
  const uint64_t rows = static_cast<uint64_t>(cfg.micro_batch_size) * cfg.seq_length;
  out.boundary = 2 * (sp ? rows / tensor : rows) * spec.hidden * sizeof(float);
  if (!spec.untie_embeddings && (stage == 0 || stage == P - 1))
    out.boundary += static_cast<uint64_t>(spec.padded_vocab) / tensor * spec.hidden * sizeof(float);
  return out;
}

}  // namespace

MemoryEstimate EstimateRunMemory(const TrainConfig& cfg, int pipeline_rank) {
  const GptSpec spec = cfg.model;
  MemoryEstimate e;
  // Under tensor parallelism a rank holds its slices (replicated norms and biases whole).
  const int tensor = std::max(1, cfg.tensor_model_parallel_size);
  const int P = std::max(1, cfg.pipeline_model_parallel_size);
  const uint64_t dp = static_cast<uint64_t>(std::max(1, cfg.data_parallel_size));
  // Micro-batches per data rank at the full global batch (the most any iteration computes).
  const int64_t micro = std::max<int64_t>(
      1, cfg.global_batch_size /
             (static_cast<int64_t>(std::max(1, cfg.micro_batch_size)) * static_cast<int64_t>(dp)));
  int V = 1;
  std::vector<StageLayers> parts;
  if (P > 1 && PipelineParts(cfg, P, &V, &parts)) {
    if (pipeline_rank < 0) {
      // The stage that needs the most: the same figure on every rank.
      MemoryEstimate most;
      for (int s = 0; s < P; ++s) {
        const MemoryEstimate m = EstimateRunMemory(cfg, s);
        if (s == 0 || m.total() > most.total()) most = m;
      }
      return most;
    }
    const StageShare share = StageShareOf(cfg, P, V, parts, std::min(pipeline_rank, P - 1), micro);
    e.params = share.params;
    e.activations = share.activations;
    e.boundary = share.boundary;
    e.pipeline_stage = std::min(pipeline_rank, P - 1);
    e.micro_batches_held = share.held;
    e.stage_layers = share.layers;
  } else {
    e.params = RankParamCount(spec, tensor);
    e.activations = GptModel::ActivationBytes(
        spec, cfg.micro_batch_size, cfg.seq_length, cfg.precision, cfg.recompute_granularity,
        cfg.full_recompute_layers(), tensor, cfg.sequence_parallel && tensor > 1);
  }
  // fp32 master weights, plus the 16-bit compute copy that bf16 and fp16 products read.
  e.weights = e.params * (sizeof(float) + (cfg.precision != Precision::kFp32 ? 2 : 0));
  e.gradients = e.params * sizeof(float);
  // AdamW's m and v; with ZeRO-1 each data-parallel rank holds its shard of them.
  const bool zero = cfg.use_distributed_optimizer && dp > 1;
  e.moments = 2 * (zero ? (e.params + dp - 1) / dp : e.params) * sizeof(float);
  // The data-parallel reduction receives one bucket from every rank.
  if (dp > 1) e.gradients += static_cast<uint64_t>(cfg.ddp_bucket_size) * dp * sizeof(float);
  // The read-ahead ring, and the loop's own buffers of one micro-batch (the tokens read, the
  // inputs and the targets: Trainer's batch_tokens_, inputs_ and targets_).
  const uint64_t mb_tokens =
      static_cast<uint64_t>(cfg.micro_batch_size) * (static_cast<uint64_t>(cfg.seq_length) + 1);
  e.data = SamplePrefetcher::BufferBytes(cfg.seq_length + 1, SamplePrefetchDepth(cfg)) +
           3 * mb_tokens * sizeof(int32_t);
  // Pipeline parallel: every stage keeps the iteration's micro-batches (inputs, targets and each
  // sequence's dataset: Trainer's pp_inputs_, pp_targets_ and pp_dataset_of_).
  if (e.pipeline_stage >= 0) {
    const uint64_t seqs = static_cast<uint64_t>(micro) * cfg.micro_batch_size;
    e.data += (2 * seqs * static_cast<uint64_t>(cfg.seq_length) + seqs) * sizeof(int32_t);
  }
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
std::string RankNote(const TrainConfig& cfg, const MemoryEstimate& e) {
  const int tensor = std::max(1, cfg.tensor_model_parallel_size);
  const std::string zero = cfg.use_distributed_optimizer && cfg.data_parallel_size > 1
                               ? ", moments sharded by ZeRO-1"
                               : "";
  if (e.pipeline_stage >= 0)
    return fmt::format(
        ", a rank of pipeline stage {} of {} ({}) at tensor parallel {}{} x pipeline {} x data "
        "parallel {}{}",
        e.pipeline_stage, cfg.pipeline_model_parallel_size, e.stage_layers, tensor,
        cfg.sequence_parallel && tensor > 1 ? " (sequence parallel)" : "",
        cfg.pipeline_model_parallel_size, cfg.data_parallel_size, zero);
  if (tensor > 1)
    return fmt::format(", this rank's slice at tensor parallel {}{} x data parallel {}{}", tensor,
                       cfg.sequence_parallel ? " (sequence parallel)" : "", cfg.data_parallel_size,
                       zero);
  if (cfg.data_parallel_size > 1)
    return fmt::format(", per rank of {}{}", cfg.data_parallel_size, zero);
  return std::string();
}

}  // namespace

std::string DescribeMemoryEstimate(const TrainConfig& cfg, const MemoryEstimate& e) {
  return fmt::format(
      "weights {}, gradients {} and AdamW moments {} ({} parameters x {} + 4 + 8 bytes{}), "
      "activations {} ({} of {} x {} tokens{}), data buffers {}{}",
      FormatBytes(e.weights), FormatBytes(e.gradients), FormatBytes(e.moments), e.params,
      cfg.precision != Precision::kFp32 ? "(4 + 2)" : "4", RankNote(cfg, e),
      FormatBytes(e.activations),
      e.micro_batches_held == 1 ? std::string("one micro-batch")
                                : fmt::format("{} micro-batches", e.micro_batches_held),
      cfg.micro_batch_size, cfg.seq_length,
      e.pipeline_stage >= 0
          ? fmt::format(" held at once by the pipeline schedule; boundary buffers {}",
                        FormatBytes(e.boundary))
          : std::string(),
      FormatBytes(e.data),
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

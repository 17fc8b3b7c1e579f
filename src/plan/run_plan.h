// RunPlan: what a run will cost before it is launched (`keel plan`). From the model shape, the
// layout (nodes x GPUs, tensor and pipeline parallel sizes) and the batch schedule it derives the
// exact parameter count, parameters and memory per GPU, the data-parallel size, which batch
// ramp-up stages that size can run (and from when all of them can), FLOPs and the days to finish.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/status.h"

namespace keel {

struct PlanInput {
  TrainConfig cfg;  // validated (ParseTrainArgs) with vocab_size set; data_parallel_size 1
  int num_nodes = 1;
  int gpus_per_node = 8;
  int tensor_parallel = 1;
  int pipeline_parallel = 1;
  int zero_stage = 0;            // 1: optimizer states sharded over the data-parallel ranks
  double iteration_seconds = 0;  // measured at the full global batch (0: not given)
  double tflops_per_gpu = 0;     // assumed achieved model TFLOPs per GPU (0: not given)
  double hours_per_day = 24;     // hours of allocation per day (queues, maintenance)
  // FLOPs as hardware executes them with activation recomputation: the forward runs twice, so 4x
  // forward instead of 3x (how BLOOM's logs count TFLOPs).
  bool recompute_activations = false;
};

// Bytes per parameter of one precision recipe, and what they come to on the most loaded GPU.
struct PlanMemory {
  std::string recipe;                                            // "fp32", "bf16 mixed", ...
  double weight_bytes = 0, grad_bytes = 0, optimizer_bytes = 0;  // per parameter
  double weights_gib = 0, grads_gib = 0, optimizer_gib = 0, total_gib = 0;  // per GPU
};

// One global batch size of the ramp-up and whether micro-batch x data-parallel size divides it.
struct PlanRampStage {
  int64_t batch = 0;
  int64_t first_sample = 0;     // consumed samples when the run reaches this batch size
  int64_t first_iteration = 0;  // 1-based iteration that first uses it
  bool feasible = false;
};

struct RunPlan {
  int world = 0, dp = 0;
  int64_t padded_vocab = 0;
  int64_t params_total = 0;               // exact, one replica (TP-padded vocabulary)
  int64_t params_formula = 0;             // n(12h^2+13h) + vh + sh + 2h, for comparison
  std::vector<int64_t> params_per_stage;  // per GPU of each pipeline stage (tensor-parallel shard)
  int max_stage = 0;                      // the stage with the most parameters per GPU
  std::vector<PlanMemory> memory;
  // What `keel train` would check on each rank of this layout before it starts (its own
  // EstimateRunMemory, activations and data buffers included; at pipeline parallel P > 1 a rank
  // of the stage that needs the most).
  uint64_t train_rank_bytes = 0;
  std::string train_rank_terms;             // DescribeMemoryEstimate's terms
  int64_t micro_batches_per_iteration = 0;  // per data-parallel rank at the full global batch
  std::vector<PlanRampStage> stages;        // empty without a ramp-up
  int64_t max_rampup_dp = 0;       // the largest DP size that runs every stage (0: no ramp-up)
  int64_t all_feasible_from = -1;  // index into stages from which every stage is feasible
  int64_t train_iters = 0, train_samples = 0, train_tokens = 0;
  double flops_per_iteration = 0;  // at the full global batch
  double total_flops = 0;
  double seconds = 0;  // wall time of the whole run (0: no time per iteration nor TFLOPs given)
  double days = 0;     // seconds over hours_per_day
  double tflops_per_gpu = 0;          // implied by a measured iteration time, or the one assumed
  std::vector<std::string> notes;     // choices made on the user's behalf
  std::vector<std::string> problems;  // the layout cannot run the whole schedule
};

// Errors (InvalidArgument) for layouts that cannot exist: GPUs not a multiple of TP x PP, TP not
// dividing heads / hidden / FFN, PP not dividing the layers, a global batch that the data-parallel
// size cannot split. A ramp-up stage the layout cannot run is a problem in the plan, not an error.
Status MakeRunPlan(const PlanInput& in, RunPlan* out);
std::string FormatRunPlan(const PlanInput& in, const RunPlan& plan);
nlohmann::json RunPlanJson(const PlanInput& in, const RunPlan& plan);

}  // namespace keel

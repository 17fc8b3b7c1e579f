#include "plan/run_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "config/parallel_layout.h"
#include "model/flops.h"
#include "model/gpt.h"
#include "model/tensor_split.h"
#include "optim/batch_rampup.h"
#include "train/memory_estimate.h"

namespace keel {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Elements of `p` one tensor-parallel rank holds: the model's own split (model/tensor_split.h).
int64_t ShardNumel(const GptSpec& spec, const ParamInfo& p, int tp) {
  int64_t n = 1;
  for (int64_t d : ShardShape(TensorSplitOf(spec, p.name, p.shape), p.shape, tp)) n *= d;
  return n;
}

// Layer index of a "layers.N." parameter, or -1.
int LayerOf(const std::string& name) {
  if (name.rfind("layers.", 0) != 0) return -1;
  return std::stoi(name.substr(7));
}

std::string Thousands(int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

std::string Human(double v) {
  const char* units[] = {"", " K", " M", " B", " T"};
  int u = 0;
  while (std::abs(v) >= 1000 && u < 4) v /= 1000, ++u;
  return fmt::format("{:.2f}{}", v, units[u]);
}

std::string BatchList(const std::vector<PlanRampStage>& stages, bool feasible) {
  std::vector<int64_t> b;
  for (const PlanRampStage& s : stages)
    if (s.feasible == feasible) b.push_back(s.batch);
  std::string out;
  const size_t n = b.size();
  for (size_t i = 0; i < n; ++i) {
    if (n > 8 && i == 4) {
      out += ", ...";
      i = n - 3;
    }
    out += (out.empty() ? "" : ", ") + std::to_string(b[i]);
  }
  return out;
}

Status Invalid(std::string msg) {
  return Status::InvalidArgument(std::move(msg));
}

Status CheckInput(const PlanInput& in) {
  if (in.num_nodes < 1)
    return Invalid(fmt::format("--num-nodes {} must be at least 1", in.num_nodes));
  if (in.gpus_per_node < 1)
    return Invalid(fmt::format("--gpus-per-node {} must be at least 1", in.gpus_per_node));
  if (in.tensor_parallel < 1)
    return Invalid(
        fmt::format("--tensor-model-parallel-size {} must be at least 1", in.tensor_parallel));
  if (in.pipeline_parallel < 1)
    return Invalid(
        fmt::format("--pipeline-model-parallel-size {} must be at least 1", in.pipeline_parallel));
  if (in.zero_stage != 0 && in.zero_stage != 1)
    return Invalid(
        fmt::format("--zero-stage {} is not modelled: use 0 (none) or 1 (optimizer "
                    "states sharded over data-parallel ranks)",
                    in.zero_stage));
  if (!(in.iteration_seconds >= 0) || !(in.tflops_per_gpu >= 0))
    return Invalid("--iteration-time and --tflops-per-gpu must not be negative");
  if (!(in.hours_per_day > 0 && in.hours_per_day <= 24))
    return Invalid(fmt::format("--hours-per-day {} must be in (0, 24]", in.hours_per_day));
  return Status::OK();
}

}  // namespace

Status MakeRunPlan(const PlanInput& in, RunPlan* out) {
  KEEL_RETURN_IF_ERROR(CheckInput(in));
  const TrainConfig& c = in.cfg;
  RunPlan p;
  const int tp = in.tensor_parallel, pp = in.pipeline_parallel;
  p.world = in.num_nodes * in.gpus_per_node;
  // The same rules `keel train` checks before it starts (config/parallel_layout.h).
  ParallelLayout par;
  KEEL_RETURN_IF_ERROR(CheckParallelLayout(
      c, p.world,
      fmt::format("{} nodes x {} GPUs = {} GPUs", in.num_nodes, in.gpus_per_node, p.world), tp, pp,
      /*layers_per_virtual_stage=*/0, &par, &p.notes));
  p.dp = par.data;
  const int64_t unit = int64_t{c.micro_batch_size} * p.dp;
  if (tp > in.gpus_per_node) {
    p.notes.push_back(
        fmt::format("tensor parallel {} spans more than one node of {} GPUs: its "
                    "all-reduces in every layer go over the network",
                    tp, in.gpus_per_node));
  }

  // Parameters: the model's own layout with Megatron's vocabulary padding for TP.
  GptSpec spec = c.model;
  p.padded_vocab = par.padded_vocab;
  spec.padded_vocab = static_cast<int>(p.padded_vocab);
  std::vector<int64_t> stage_layers(pp);
  for (int s = 0; s < pp; ++s)
    stage_layers[s] = c.model.num_layers / pp + (s < c.model.num_layers % pp ? 1 : 0);
  // Every layer's tensors are alike: one layer's layout stands for all of them, so a plan of a
  // billion layers lists 16 tensors, not 16 billion.
  GptSpec one_layer = spec;
  one_layer.num_layers = 1;
  const std::vector<ParamInfo> layout = GptModel::ParamLayout(one_layer);
  p.params_formula = GptModel::FormulaParamCount(spec);
  p.params_per_stage.assign(pp, 0);
  for (const ParamInfo& info : layout) {
    const int64_t shard = ShardNumel(spec, info, tp);
    if (LayerOf(info.name) >= 0) {
      p.params_total += static_cast<int64_t>(info.numel) * c.model.num_layers;
      for (int s = 0; s < pp; ++s) p.params_per_stage[s] += shard * stage_layers[s];
      continue;
    }
    p.params_total += static_cast<int64_t>(info.numel);
    if (info.name.rfind("embedding.", 0) == 0) {
      p.params_per_stage[0] += shard;
      // A tied output layer reuses the word embedding; the last stage keeps its own copy.
      if (pp > 1 && info.name == "embedding.word_embeddings.weight" && !spec.untie_embeddings)
        p.params_per_stage[pp - 1] += shard;
    } else {
      p.params_per_stage[pp - 1] += shard;  // final norm, an untied output layer
    }
  }
  p.max_stage =
      static_cast<int>(std::max_element(p.params_per_stage.begin(), p.params_per_stage.end()) -
                       p.params_per_stage.begin());

  // Memory per GPU. Mixed precision keeps fp32 master weights and Adam's m and v (12 bytes);
  // bf16 accumulates gradients in fp32 (Megatron's default for bf16), fp16 in fp16. 8-bit Adam
  // stores m and v in one byte each plus an fp32 scale per block of 2048.
  const double per_gpu = static_cast<double>(p.params_per_stage[p.max_stage]);
  const double opt_share = in.zero_stage == 1 ? 1.0 / p.dp : 1.0;
  const double blockwise = 2.0 * 4.0 / 2048.0;
  const struct {
    const char* name;
    double w, g, o;
  } recipes[] = {{"fp32", 4, 4, 8},
                 {"bf16 mixed", 2, 4, 12},
                 {"fp16 mixed", 2, 2, 12},
                 {"bf16 + 8-bit Adam", 2, 4, 4 + 2 + blockwise}};
  for (const auto& r : recipes) {
    PlanMemory m;
    m.recipe = r.name;
    m.weight_bytes = r.w;
    m.grad_bytes = r.g;
    m.optimizer_bytes = r.o;
    m.weights_gib = per_gpu * r.w / kGiB;
    m.grads_gib = per_gpu * r.g / kGiB;
    m.optimizer_gib = per_gpu * r.o * opt_share / kGiB;
    m.total_gib = m.weights_gib + m.grads_gib + m.optimizer_gib;
    p.memory.push_back(m);
  }

  // The same function keel train checks a rank's memory with, at this layout (one process per
  // rank; at P > 1 a rank of the stage that needs the most), so the two figures cannot disagree.
  {
    TrainConfig rank = c;
    rank.model.padded_vocab = static_cast<int>(p.padded_vocab);
    rank.tensor_model_parallel_size = tp;
    rank.pipeline_model_parallel_size = pp;
    rank.data_parallel_size = p.dp;
    rank.use_distributed_optimizer = in.zero_stage == 1 || c.use_distributed_optimizer;
    const MemoryEstimate e = EstimateRunMemory(rank);
    p.train_rank_bytes = e.total();
    p.train_rank_terms = DescribeMemoryEstimate(rank, e);
  }

  // The batch schedule: every ramp-up stage with the sample and iteration where it begins.
  p.micro_batches_per_iteration = c.global_batch_size / unit;
  const BatchRampup ramp = BatchRampup::FromConfig(c);
  p.train_iters = TotalTrainIters(c);
  int64_t consumed = 0;
  for (int64_t it = 1; it <= p.train_iters; ++it) {
    const int64_t b = ramp.GlobalBatchAt(consumed);
    if (ramp.ramps() && (p.stages.empty() || p.stages.back().batch != b)) {
      p.stages.push_back({b, consumed, it, b % unit == 0});
    }
    consumed += b;
  }
  p.train_samples = consumed;
  p.train_tokens = consumed * c.seq_length;
  if (ramp.ramps()) {
    int64_t g = 0;
    for (const PlanRampStage& s : p.stages) g = std::gcd(g, s.batch);
    p.max_rampup_dp = g / c.micro_batch_size;
    int64_t k = static_cast<int64_t>(p.stages.size());
    while (k > 0 && p.stages[k - 1].feasible) --k;
    p.all_feasible_from = k < static_cast<int64_t>(p.stages.size()) ? k : -1;
    if (k > 0) {
      const std::string from =
          p.all_feasible_from >= 0
              ? fmt::format(
                    "it can join the run at iteration {} (sample {}), when the global "
                    "batch reaches {}",
                    Thousands(p.stages[k].first_iteration), Thousands(p.stages[k].first_sample),
                    p.stages[k].batch)
              : std::string("no point of the ramp-up suits it");
      const int64_t gpus = p.max_rampup_dp * tp * pp;
      const std::string nodes = gpus % in.gpus_per_node == 0
                                    ? fmt::format("{} nodes", gpus / in.gpus_per_node)
                                    : fmt::format("{} GPUs", gpus);
      p.problems.push_back(fmt::format(
          "ramp-up batch sizes {} are not multiples of --micro-batch-size {} x data-parallel size "
          "{} = {}: this layout cannot run the whole ramp-up; {}; before that use a data-parallel "
          "size of at most {} ({})",
          BatchList(p.stages, false), c.micro_batch_size, p.dp, unit, from, p.max_rampup_dp,
          nodes));
    }
  }

  // FLOPs (matmuls, Megatron's convention) and time.
  const double per_token =
      TrainingFlopsPerToken(spec, c.seq_length) * (in.recompute_activations ? 4.0 / 3.0 : 1.0);
  p.flops_per_iteration = per_token * static_cast<double>(c.global_batch_size) * c.seq_length;
  p.total_flops = per_token * static_cast<double>(p.train_tokens);
  if (in.iteration_seconds > 0) {
    // Ramp-up iterations cost in proportion to their batch.
    p.seconds = in.iteration_seconds * static_cast<double>(p.train_samples) / c.global_batch_size;
    p.tflops_per_gpu = p.flops_per_iteration / in.iteration_seconds / p.world / 1e12;
  } else if (in.tflops_per_gpu > 0) {
    p.tflops_per_gpu = in.tflops_per_gpu;
    p.seconds = p.total_flops / (in.tflops_per_gpu * 1e12 * p.world);
  }
  p.days = p.seconds / (3600.0 * in.hours_per_day);
  *out = std::move(p);
  return Status::OK();
}

namespace {

// ", RoPE, RMSNorm, untied output, no linear biases": what sets the shape apart from GPT-2's.
std::string ModelOptions(const TrainConfig& c) {
  std::string s;
  if (c.model.Position() == PositionEmbedding::kRope) s += ", RoPE";
  if (c.model.Position() == PositionEmbedding::kAlibi) s += ", ALiBi";
  if (c.model.rmsnorm) s += ", RMSNorm";
  if (c.model.untie_embeddings) s += ", untied output layer";
  if (!c.model.bias) s += ", no linear biases";
  return s;
}

}  // namespace

std::string FormatRunPlan(const PlanInput& in, const RunPlan& p) {
  const TrainConfig& c = in.cfg;
  std::string s;
  s += fmt::format(
      "model: {} layers, hidden {}, {} heads{}, FFN {}{}, sequence {}, vocab {} (padded {}){}\n",
      c.model.num_layers, c.model.hidden, c.model.heads,
      c.model.group_query_attention ? fmt::format(" ({} key/value)", c.model.num_query_groups) : "",
      c.model.ffn_hidden, c.model.swiglu ? " SwiGLU" : "", c.seq_length, c.model.vocab,
      p.padded_vocab, ModelOptions(c));
  if (GptModel::IsGpt2Shape(c.model)) {
    s += fmt::format(
        "parameters: {} exact ({}); formula n(12h^2+13h)+vh+sh+2h gives {}{}\n",
        Thousands(p.params_total), Human(static_cast<double>(p.params_total)),
        Thousands(p.params_formula),
        p.params_formula == p.params_total ? " (equal)" : " (differs: non-default shape)");
  } else {
    s += fmt::format("parameters: {} exact ({}), from the model's own layout\n",
                     Thousands(p.params_total), Human(static_cast<double>(p.params_total)));
  }
  s += fmt::format(
      "layout: {} nodes x {} GPUs = {} GPUs = tensor parallel {} x pipeline parallel {} "
      "x data parallel {}\n",
      in.num_nodes, in.gpus_per_node, p.world, in.tensor_parallel, in.pipeline_parallel, p.dp);
  s += "parameters per GPU:";
  for (size_t i = 0; i < p.params_per_stage.size(); ++i)
    s += fmt::format("{} stage {}: {}", i ? "," : "", i, Thousands(p.params_per_stage[i]));
  s += fmt::format(" (most: stage {})\n", p.max_stage);
  s += fmt::format(
      "memory per GPU, stage {} (weights + gradients + optimizer states{}; "
      "activations not included):\n",
      p.max_stage, in.zero_stage == 1 ? ", optimizer sharded over DP (ZeRO-1)" : "");
  s += fmt::format("  {:<18} {:>10} {:>10} {:>10} {:>10}   bytes/param\n", "recipe", "weights",
                   "grads", "optimizer", "total");
  for (const PlanMemory& m : p.memory) {
    s += fmt::format(
        "  {:<18} {:>6.2f} GiB {:>6.2f} GiB {:>6.2f} GiB {:>6.2f} GiB   {:g}+{:g}+{:.3g}\n",
        m.recipe, m.weights_gib, m.grads_gib, m.optimizer_gib, m.total_gib, m.weight_bytes,
        m.grad_bytes, m.optimizer_bytes);
  }
  if (p.train_rank_bytes > 0)
    s += fmt::format("keel train on CPU ranks: {} per rank ({})\n", FormatBytes(p.train_rank_bytes),
                     p.train_rank_terms);
  s += fmt::format(
      "batch: global {}, micro {}, {} micro-batches per data-parallel rank per iteration\n",
      c.global_batch_size, c.micro_batch_size, p.micro_batches_per_iteration);
  if (!p.stages.empty()) {
    const auto& r = c.rampup_batch_size;
    size_t ok = 0;
    for (const PlanRampStage& st : p.stages) ok += st.feasible;
    s += fmt::format(
        "ramp-up {} {} {}: {} batch sizes, {} of them runnable at data parallel {} "
        "(multiples of {})\n",
        r[0], r[1], r[2], p.stages.size(), ok, p.dp, int64_t{c.micro_batch_size} * p.dp);
    if (ok) s += "  runnable: " + BatchList(p.stages, true) + "\n";
    if (ok < p.stages.size()) s += "  not runnable: " + BatchList(p.stages, false) + "\n";
    s += fmt::format("  largest data-parallel size for the whole ramp-up: {}\n", p.max_rampup_dp);
    if (p.all_feasible_from >= 0) {
      const PlanRampStage& st = p.stages[p.all_feasible_from];
      s += fmt::format("  runnable from iteration {} (sample {}, batch {}) to the end\n",
                       Thousands(st.first_iteration), Thousands(st.first_sample), st.batch);
    }
  }
  s += fmt::format("length: {} iterations, {} samples, {} tokens\n", Thousands(p.train_iters),
                   Thousands(p.train_samples), Human(static_cast<double>(p.train_tokens)));
  s += fmt::format("FLOPs: {:.4g} per iteration (global batch), {:.4g} for the run{}\n",
                   p.flops_per_iteration, p.total_flops,
                   in.recompute_activations ? " (with activation recomputation: 4x forward)" : "");
  if (p.seconds > 0) {
    s += fmt::format(
        "time: {:.1f} days at {:g} h/day ({:.0f} hours of training); {:.1f} TFLOPs "
        "per GPU{}\n",
        p.days, in.hours_per_day, p.seconds / 3600, p.tflops_per_gpu,
        in.iteration_seconds > 0 ? " implied by the iteration time" : " assumed");
  } else {
    s += "time: give --iteration-time SECONDS (measured) or --tflops-per-gpu N (assumed)\n";
  }
  return s;
}

nlohmann::json RunPlanJson(const PlanInput& in, const RunPlan& p) {
  using nlohmann::json;
  const TrainConfig& c = in.cfg;
  json memory = json::array();
  for (const PlanMemory& m : p.memory) {
    memory.push_back(
        {{"recipe", m.recipe},
         {"bytes_per_param",
          {{"weights", m.weight_bytes}, {"grads", m.grad_bytes}, {"optimizer", m.optimizer_bytes}}},
         {"weights_gib", m.weights_gib},
         {"grads_gib", m.grads_gib},
         {"optimizer_gib", m.optimizer_gib},
         {"total_gib", m.total_gib}});
  }
  json stages = json::array();
  for (const PlanRampStage& st : p.stages) {
    stages.push_back({{"batch", st.batch},
                      {"first_sample", st.first_sample},
                      {"first_iteration", st.first_iteration},
                      {"feasible", st.feasible}});
  }
  json j = {{"model",
             {{"num_layers", c.model.num_layers},
              {"hidden_size", c.model.hidden},
              {"num_attention_heads", c.model.heads},
              {"ffn_hidden_size", c.model.ffn_hidden},
              {"num_query_groups", c.model.KvHeads()},
              {"swiglu", c.model.swiglu},
              {"normalization", c.model.rmsnorm ? "RMSNorm" : "LayerNorm"},
              {"position_embedding_type", c.model.Position() == PositionEmbedding::kRope ? "rope"
                                          : c.model.Position() == PositionEmbedding::kAlibi
                                              ? "alibi"
                                              : "learned_absolute"},
              {"untie_embeddings_and_output_weights", c.model.untie_embeddings},
              {"add_bias_linear", !!c.model.bias},
              {"seq_length", c.seq_length},
              {"vocab_size", c.model.vocab},
              {"padded_vocab_size", p.padded_vocab}}},
            {"parameters", p.params_total},
            {"parameters_formula", p.params_formula},
            {"layout",
             {{"num_nodes", in.num_nodes},
              {"gpus_per_node", in.gpus_per_node},
              {"world_size", p.world},
              {"tensor_model_parallel_size", in.tensor_parallel},
              {"pipeline_model_parallel_size", in.pipeline_parallel},
              {"data_parallel_size", p.dp},
              {"zero_stage", in.zero_stage}}},
            {"parameters_per_gpu", p.params_per_stage},
            {"most_loaded_stage", p.max_stage},
            {"memory_per_gpu", memory},
            {"keel_train_bytes_per_rank", p.train_rank_bytes},
            {"global_batch_size", c.global_batch_size},
            {"micro_batch_size", c.micro_batch_size},
            {"micro_batches_per_iteration", p.micro_batches_per_iteration},
            {"rampup_stages", stages},
            {"max_rampup_data_parallel_size", p.max_rampup_dp},
            {"train_iters", p.train_iters},
            {"train_samples", p.train_samples},
            {"train_tokens", p.train_tokens},
            {"flops_per_iteration", p.flops_per_iteration},
            {"total_flops", p.total_flops},
            {"seconds", p.seconds},
            {"days", p.days},
            {"hours_per_day", in.hours_per_day},
            {"tflops_per_gpu", p.tflops_per_gpu},
            {"recompute_activations", in.recompute_activations},
            {"feasible", p.problems.empty()},
            {"problems", p.problems},
            {"notes", p.notes}};
  if (p.all_feasible_from >= 0) {
    const PlanRampStage& st = p.stages[p.all_feasible_from];
    j["feasible_from"] = {
        {"iteration", st.first_iteration}, {"sample", st.first_sample}, {"batch", st.batch}};
  }
  return j;
}

}  // namespace keel

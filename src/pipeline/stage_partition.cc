#include "pipeline/stage_partition.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <regex>

namespace keel {
namespace {

// DeepSpeed's partition_uniform (the current one): boundaries of `parts` parts of `items` items,
// the first items % parts parts one larger; with fewer items than parts, one item each.
std::vector<int> UniformBounds(int items, int parts) {
  std::vector<int> b(parts + 1);
  if (items <= parts) {
    for (int p = 0; p <= parts; ++p) b[p] = std::min(p, items);
    return b;
  }
  const int chunk = items / parts, residual = items % parts;
  for (int p = 0; p <= parts; ++p) b[p] = p * chunk + std::min(p, residual);
  return b;
}

// Parts filled greedily from the front, each taking items while its weight stays <= bottleneck
// (zero-weight items after a full part stay in it); the remaining parts empty.
std::vector<int> GreedyBounds(const std::vector<int64_t>& w, int parts, int64_t bottleneck,
                              bool* fits) {
  const int n = static_cast<int>(w.size());
  std::vector<int> b(parts + 1, n);
  b[0] = 0;
  int i = 0;
  for (int p = 0; p < parts; ++p) {
    b[p] = i;
    int64_t sum = 0;
    while (i < n && sum + w[i] <= bottleneck) sum += w[i++];
  }
  b[parts] = n;
  *fits = i == n;
  return b;
}

// DeepSpeed's partition_balanced of the BigScience era: the smallest bottleneck (the heaviest
// part's weight) a greedy fill achieves, found by bisection, then that fill. Integer weights make
// the bisection exact where DeepSpeed's stops within eps.
std::vector<int> BalancedBounds(const std::vector<int64_t>& w, int parts) {
  const int n = static_cast<int>(w.size());
  if (n <= parts) return UniformBounds(n, parts);
  int64_t total = 0, heaviest = 0;
  for (int64_t x : w) total += x, heaviest = std::max(heaviest, x);
  int64_t lo = std::max(heaviest, (total + parts - 1) / parts), hi = total;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    bool fits = false;
    GreedyBounds(w, parts, mid, &fits);
    if (fits) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  bool fits = false;
  return GreedyBounds(w, parts, lo, &fits);
}

std::string LayerRange(const StageLayers& s) {
  if (s.count() == 0) return "no layers";
  if (s.count() == 1) return fmt::format("layer {}", s.first);
  return fmt::format("layers {}-{} ({})", s.first, s.last - 1, s.count());
}

}  // namespace

PartitionModel PartitionModelOf(const GptSpec& s) {
  const int64_t h = s.hidden;
  const int64_t vocab = s.padded_vocab > 0 ? s.padded_vocab : s.vocab;
  const int64_t norm = s.rmsnorm ? h : 2 * h;
  const int64_t bias = s.bias ? 1 : 0;
  PartitionModel m;
  m.num_layers = s.num_layers;
  m.rmsnorm = s.rmsnorm;
  m.tied_head = !s.untie_embeddings;
  m.embedding_params = vocab * h + (s.LearnedPositions() ? int64_t{s.max_positions} * h : 0) +
                       (s.embed_layernorm ? norm : 0);
  const int64_t qkv = s.QkvWidth(), fc1 = s.Fc1Width(), ffn = s.ffn_hidden;
  m.layer_params = 2 * norm + qkv * h + bias * qkv + h * h + bias * h + fc1 * h + bias * fc1 +
                   ffn * h + bias * h + (s.qk_layernorm ? 4 * int64_t{s.HeadDim()} : 0);
  m.final_norm_params = norm;
  m.head_params = vocab * h;
  return m;
}

Status PartitionStages(const std::string& method, const PartitionModel& model, int pipeline,
                       int virtual_stages, std::vector<StageLayers>* out) {
  const int L = model.num_layers, P = pipeline, V = virtual_stages;
  if (P < 1 || V < 1 || L < 1)
    return Status::InvalidArgument(fmt::format(
        "pipeline partition of {} layers over {} stages x {} chunks: every size must be at least 1",
        L, P, V));
  const int S = P * V;
  if (L < S) {
    return Status::InvalidArgument(
        fmt::format("{} layers cannot fill {} pipeline stages x {} chunks: every stage needs a "
                    "layer; use a pipeline size of at most {}",
                    L, P, V, L / V > 0 ? L / V : 1));
  }
  std::vector<StageLayers> stages(S);
  if (method.empty()) {
    if (V > 1) {
      if (L % S != 0) {
        return Status::InvalidArgument(fmt::format(
            "the interleaved schedule needs --num-layers {} to be pipeline size {} x {} chunks x "
            "the layers per chunk; change --num-layers-per-virtual-pipeline-stage",
            L, P, V));
      }
      const int k = L / S;
      for (int s = 0; s < S; ++s) stages[s] = {s * k, (s + 1) * k, s == 0, s == S - 1};
    } else {
      const std::vector<int> b = UniformBounds(L, P);
      for (int p = 0; p < P; ++p) stages[p] = {b[p], b[p + 1], p == 0, p == P - 1};
    }
    *out = std::move(stages);
    return Status::OK();
  }
  if (V > 1) {
    return Status::InvalidArgument(fmt::format(
        "--pp-partition-method {} cannot be combined with the interleaved schedule "
        "(--num-layers-per-virtual-pipeline-stage): interleaving uses Megatron-LM's equal chunks; "
        "drop one of the two",
        method));
  }
  // Megatron-DeepSpeed's layer list: embedding, the transformer layers, final norm, output layer.
  const int n = L + 3;
  std::vector<int> bounds;
  if (method == "uniform") {
    bounds = UniformBounds(n, P);
  } else if (method == "parameters" || method.rfind("type:", 0) == 0) {
    std::vector<int64_t> w(n);
    if (method == "parameters") {
      w[0] = model.embedding_params;
      for (int i = 1; i <= L; ++i) w[i] = model.layer_params;
      w[L + 1] = model.final_norm_params;
      w[L + 2] = model.head_params;
    } else {
      const std::string pattern = method.substr(5);
      std::regex re;
      try {
        re = std::regex(pattern, std::regex::ECMAScript | std::regex::icase);
      } catch (const std::regex_error& e) {
        return Status::InvalidArgument(fmt::format(
            "--pp-partition-method {}: '{}' is not a valid regular expression ({}); e.g. "
            "type:transformer or type:transformer|embedding",
            method, pattern, e.what()));
      }
      const std::string names[4] = {"EmbeddingPipe", "ParallelTransformerLayerPipe",
                                    model.rmsnorm ? "MixedFusedRMSNorm" : "MixedFusedLayerNorm",
                                    model.tied_head ? "EmbeddingPipe" : "LMHeadPipe"};
      auto weight = [&](int kind) { return std::regex_search(names[kind], re) ? 1 : 0; };
      w[0] = weight(0);
      for (int i = 1; i <= L; ++i) w[i] = weight(1);
      w[L + 1] = weight(2);
      w[L + 2] = weight(3);
      if (std::all_of(w.begin(), w.end(), [](int64_t x) { return x == 0; })) {
        return Status::InvalidArgument(fmt::format(
            "--pp-partition-method {}: '{}' matches none of the layer class names "
            "(EmbeddingPipe, ParallelTransformerLayerPipe, {}, {}); e.g. type:transformer",
            method, pattern, names[2], names[3]));
      }
    }
    bounds = BalancedBounds(w, P);
  } else {
    return Status::InvalidArgument(fmt::format(
        "--pp-partition-method {} is not supported: keel has uniform, parameters and "
        "type:REGEX (e.g. type:transformer|embedding), or the default (omit the flag) for "
        "Megatron-LM's equal split",
        method));
  }
  const int norm_item = L + 1, head_item = L + 2;
  bool norm_with_head = true;
  for (int p = 0; p < P; ++p) {
    const int a = bounds[p], b = bounds[p + 1];
    StageLayers& s = stages[p];
    s.embedding = a == 0 && b > 0;
    s.first = std::clamp(a, 1, L + 1) - 1;
    s.last = std::clamp(b, 1, L + 1) - 1;
    s.head = a <= head_item && head_item < b;
    norm_with_head &= (a <= norm_item && norm_item < b) == s.head;
  }
  for (int p = 0; p < P; ++p) {
    if (stages[p].count() == 0) {
      std::vector<std::string> counts;
      for (const StageLayers& s : stages) counts.push_back(std::to_string(s.count()));
      return Status::InvalidArgument(fmt::format(
          "--pp-partition-method {} leaves pipeline stage {} without a transformer layer ({} "
          "layers over {} stages: {}); use the default split, uniform, or fewer stages",
          method, p, L, P, fmt::join(counts, ", ")));
    }
  }
  if (!norm_with_head) {
    return Status::InvalidArgument(fmt::format(
        "--pp-partition-method {} puts the final norm and the output layer on different stages; "
        "use the default split or uniform",
        method));
  }
  *out = std::move(stages);
  return Status::OK();
}

std::string DescribePartition(const std::vector<StageLayers>& stages, int pipeline) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < stages.size(); ++i) {
    const StageLayers& s = stages[i];
    const int stage = static_cast<int>(i) % pipeline, chunk = static_cast<int>(i) / pipeline;
    std::string what = stages.size() > static_cast<size_t>(pipeline)
                           ? fmt::format("stage {} chunk {}: ", stage, chunk)
                           : fmt::format("stage {}: ", stage);
    if (s.embedding) what += "embedding + ";
    what += LayerRange(s);
    if (s.head) what += " + head";
    parts.push_back(what);
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

}  // namespace keel

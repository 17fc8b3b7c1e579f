#include "model/tensor_split.h"

#include <cstring>

#include "core/status.h"

namespace keel {
namespace {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Visits, for rank `rank` of `tensor`, every contiguous run of the slice: f(full offset, shard
// offset, length), in floats.
template <typename F>
void ForEachRun(const std::vector<int64_t>& shape, const TensorSplit& split, int rank, int tensor,
                F f) {
  const int d = split.dim;
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < d; ++i) outer *= shape[i];
  for (size_t i = d + 1; i < shape.size(); ++i) inner *= shape[i];
  const int64_t extent = shape[d], local = extent / tensor;
  for (int64_t o = 0; o < outer; ++o) {
    int64_t start = 0, shard_pos = 0;
    for (int64_t part : split.parts) {
      const int64_t len = part / tensor;
      f((o * extent + start + rank * len) * inner, (o * local + shard_pos) * inner, len * inner);
      start += part;
      shard_pos += len;
    }
  }
}

}  // namespace

TensorSplit TensorSplitOf(const GptSpec& spec, const std::string& name,
                          const std::vector<int64_t>& shape) {
  TensorSplit s;
  if (name == "embedding.word_embeddings.weight" || name == "output_layer.weight") {
    s.dim = 0, s.parts = {shape[0]};
  } else if (name.find(".attention.query_key_value.") != std::string::npos) {
    const int64_t hs = spec.HeadDim();
    s.dim = 0, s.parts = {spec.heads * hs, spec.KvHeads() * hs, spec.KvHeads() * hs};
  } else if (name.find(".mlp.dense_h_to_4h.") != std::string::npos) {
    s.dim = 0;
    s.parts = spec.swiglu ? std::vector<int64_t>{shape[0] / 2, shape[0] / 2}
                          : std::vector<int64_t>{shape[0]};
  } else if (EndsWith(name, ".attention.dense.weight") ||
             EndsWith(name, ".mlp.dense_4h_to_h.weight")) {
    s.dim = 1, s.parts = {shape[1]};
  }
  if (!s.replicated()) {
    int64_t sum = 0;
    for (int64_t p : s.parts) sum += p;
    KEEL_CHECK(s.dim < static_cast<int>(shape.size()) && sum == shape[s.dim],
               "the tensor-parallel split of " + name + " does not match its shape");
  }
  return s;
}

std::vector<int64_t> ShardShape(const TensorSplit& split, const std::vector<int64_t>& shape,
                                int tensor) {
  std::vector<int64_t> out = shape;
  if (!split.replicated()) out[split.dim] /= tensor;
  return out;
}

void ExtractShard(const float* full, const std::vector<int64_t>& shape, const TensorSplit& split,
                  int rank, int tensor, float* shard) {
  if (split.replicated()) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::memcpy(shard, full, n * sizeof(float));
    return;
  }
  ForEachRun(shape, split, rank, tensor, [&](int64_t from, int64_t to, int64_t len) {
    std::memcpy(shard + to, full + from, len * sizeof(float));
  });
}

void InsertShard(const float* shard, const std::vector<int64_t>& shape, const TensorSplit& split,
                 int rank, int tensor, float* full) {
  if (split.replicated()) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::memcpy(full, shard, n * sizeof(float));
    return;
  }
  ForEachRun(shape, split, rank, tensor, [&](int64_t to, int64_t from, int64_t len) {
    std::memcpy(full + to, shard + from, len * sizeof(float));
  });
}

}  // namespace keel

// TensorSplit: how each tensor of the model is cut across T tensor-parallel ranks (Megatron-LM's
// sharding), described once for the model, `keel plan`'s memory per rank and the checkpoints that
// load at any layout:
//
//   column-parallel  split along dim 0 (output features): attention.query_key_value (weight and
//                    bias; each of its parts [q (NH heads) | k (G) | v (G)] cut in T, so a rank
//                    holds whole heads of each), mlp.dense_h_to_4h (SwiGLU: each half [g | u] cut)
//   row-parallel     split along dim 1 (input features): attention.dense.weight,
//                    mlp.dense_4h_to_h.weight; their biases are replicated (added once, after the
//                    all-reduce)
//   vocab-parallel   split along dim 0 (vocabulary rows): embedding.word_embeddings.weight,
//                    output_layer.weight
//   replicated       everything else: norms, position embeddings, QK-LayerNorm weights
//
// A split along `dim` with parts p_0, p_1, ... (sizes along dim, summing to its extent) gives rank
// r of T the slice [start_k + r p_k / T, start_k + (r+1) p_k / T) of every part k, in order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/model_shape.h"

namespace keel {

struct TensorSplit {
  int dim = -1;                // -1: replicated
  std::vector<int64_t> parts;  // sizes along `dim` of the parts each cut in T

  bool replicated() const { return dim < 0; }
};

// The split of the model's tensor `name` (a layout-free name, "layers.3.mlp.dense_h_to_4h.weight")
// of full shape `shape`. The tensor must belong to `spec`'s layout (GptModel::ParamLayout).
TensorSplit TensorSplitOf(const GptSpec& spec, const std::string& name,
                          const std::vector<int64_t>& shape);

// The shape one rank of `tensor` holds.
std::vector<int64_t> ShardShape(const TensorSplit& split, const std::vector<int64_t>& shape,
                                int tensor);

// Copies rank `rank` of `tensor`'s slice out of the full row-major tensor, or back into it.
void ExtractShard(const float* full, const std::vector<int64_t>& shape, const TensorSplit& split,
                  int rank, int tensor, float* shard);
void InsertShard(const float* shard, const std::vector<int64_t>& shape, const TensorSplit& split,
                 int rank, int tensor, float* full);

}  // namespace keel

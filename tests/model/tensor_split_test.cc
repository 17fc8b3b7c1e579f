// TensorSplit: every tensor of the model is cut as Megatron-LM cuts it, and the T slices of a
// tensor put back together give the tensor (so a checkpoint written at one T reads at another).
#include "model/tensor_split.h"

#include <gtest/gtest.h>

#include <numeric>

#include "model/gpt.h"

namespace keel {
namespace {

GptSpec LlamaLike() {
  GptSpec s;
  s.num_layers = 1, s.hidden = 16, s.heads = 4, s.ffn_hidden = 8, s.vocab = 10, s.padded_vocab = 16;
  s.max_positions = 8, s.rope = true, s.rmsnorm = true, s.swiglu = true, s.bias = false;
  s.untie_embeddings = true;
  s.group_query_attention = true, s.num_query_groups = 2;
  return s;
}

TEST(TensorSplitTest, QkvCutsEachOfQKAndVIntoWholeHeads) {
  const GptSpec s = LlamaLike();  // hs 4: q 16 rows, k 8, v 8
  const std::vector<int64_t> shape = {32, 16};
  const TensorSplit split = TensorSplitOf(s, "layers.0.attention.query_key_value.weight", shape);
  EXPECT_EQ(split.dim, 0);
  EXPECT_EQ(split.parts, (std::vector<int64_t>{16, 8, 8}));
  std::vector<float> full(32 * 16);
  std::iota(full.begin(), full.end(), 0.0f);
  std::vector<float> shard(16 * 16);
  ExtractShard(full.data(), shape, split, 1, 2, shard.data());
  // Rank 1 of 2: q rows 8..15, k rows 16+4..16+7, v rows 24+4..24+7.
  EXPECT_EQ(shard[0], full[8 * 16]);
  EXPECT_EQ(shard[8 * 16], full[20 * 16]);
  EXPECT_EQ(shard[12 * 16], full[28 * 16]);
}

TEST(TensorSplitTest, EveryTensorRoundTripsThroughItsSlicesAtEveryT) {
  const GptSpec s = LlamaLike();
  for (const ParamInfo& p : GptModel::ParamLayout(s)) {
    const TensorSplit split = TensorSplitOf(s, p.name, p.shape);
    std::vector<float> full(p.numel);
    std::iota(full.begin(), full.end(), 1.0f);
    for (int t : {1, 2}) {
      std::vector<float> back(p.numel, 0.0f);
      int64_t shard_numel = 1;
      for (int64_t d : ShardShape(split, p.shape, t)) shard_numel *= d;
      EXPECT_EQ(shard_numel * (split.replicated() ? 1 : t), static_cast<int64_t>(p.numel))
          << p.name;
      for (int r = 0; r < t; ++r) {
        std::vector<float> shard(shard_numel);
        ExtractShard(full.data(), p.shape, split, r, t, shard.data());
        InsertShard(shard.data(), p.shape, split, r, t, back.data());
      }
      EXPECT_EQ(back, full) << p.name << " at T " << t;
    }
  }
}

TEST(TensorSplitTest, RowParallelWeightsSplitInputsAndTheirBiasesAreReplicated) {
  GptSpec s;  // GPT-2 shape with biases
  s.num_layers = 1, s.hidden = 8, s.heads = 2, s.ffn_hidden = 32, s.vocab = 10, s.padded_vocab = 16;
  s.max_positions = 8;
  EXPECT_EQ(TensorSplitOf(s, "layers.0.attention.dense.weight", {8, 8}).dim, 1);
  EXPECT_EQ(TensorSplitOf(s, "layers.0.mlp.dense_4h_to_h.weight", {8, 32}).dim, 1);
  EXPECT_TRUE(TensorSplitOf(s, "layers.0.mlp.dense_4h_to_h.bias", {8}).replicated());
  EXPECT_TRUE(TensorSplitOf(s, "layers.0.attention.dense.bias", {8}).replicated());
  EXPECT_EQ(TensorSplitOf(s, "layers.0.mlp.dense_h_to_4h.bias", {32}).dim, 0);
  EXPECT_TRUE(TensorSplitOf(s, "embedding.position_embeddings.weight", {8, 8}).replicated());
  EXPECT_TRUE(TensorSplitOf(s, "final_layernorm.weight", {8}).replicated());
  EXPECT_EQ(TensorSplitOf(s, "embedding.word_embeddings.weight", {16, 8}).dim, 0);
}

}  // namespace
}  // namespace keel

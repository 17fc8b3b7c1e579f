// Stage partition: Megatron-LM's equal split (and its interleaved chunks), and Megatron-DeepSpeed's
// --pp-partition-method values: uniform, parameters, type:REGEX (BLOOM's
// "type:transformer|embedding"); anything else refused naming the methods there are.
#include "pipeline/stage_partition.h"

#include <gtest/gtest.h>

namespace keel {
namespace {

PartitionModel Layers(int n) {
  PartitionModel m;
  m.num_layers = n;
  m.embedding_params = 1000, m.layer_params = 100, m.final_norm_params = 2, m.head_params = 1000;
  return m;
}

std::vector<int> Counts(const std::vector<StageLayers>& s) {
  std::vector<int> c;
  for (const StageLayers& x : s) c.push_back(x.count());
  return c;
}

void ExpectContiguous(const std::vector<StageLayers>& s, int layers) {
  int next = 0;
  for (const StageLayers& x : s) {
    EXPECT_EQ(x.first, next);
    next = x.last;
  }
  EXPECT_EQ(next, layers);
  EXPECT_TRUE(s.front().embedding);
  EXPECT_TRUE(s.back().head);
  for (size_t i = 1; i < s.size(); ++i) EXPECT_FALSE(s[i].embedding);
  for (size_t i = 0; i + 1 < s.size(); ++i) EXPECT_FALSE(s[i].head);
}

TEST(StagePartitionTest, DefaultIsMegatronLmsEqualSplit) {
  std::vector<StageLayers> s;
  ASSERT_TRUE(PartitionStages("", Layers(24), 4, 1, &s).ok());
  EXPECT_EQ(Counts(s), (std::vector<int>{6, 6, 6, 6}));
  ExpectContiguous(s, 24);
  // Uneven: the first L % P stages one more (the note CheckParallelLayout writes).
  ASSERT_TRUE(PartitionStages("", Layers(10), 4, 1, &s).ok());
  EXPECT_EQ(Counts(s), (std::vector<int>{3, 3, 2, 2}));
  EXPECT_EQ(DescribePartition(s, 4),
            "stage 0: embedding + layers 0-2 (3), stage 1: layers 3-5 (3), stage 2: layers 6-7 "
            "(2), stage 3: layers 8-9 (2) + head");
}

TEST(StagePartitionTest, InterleavedChunksAreVirtualStagesInMegatronsOrder) {
  // 8 layers, P 2, V 2: virtual stage c P + r holds layers [2 (c P + r), ...): stage 0 holds
  // layers 0-1 and 4-5, stage 1 layers 2-3 and 6-7.
  std::vector<StageLayers> s;
  ASSERT_TRUE(PartitionStages("", Layers(8), 2, 2, &s).ok());
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(s[0].first, 0);  // stage 0 chunk 0
  EXPECT_EQ(s[1].first, 2);  // stage 1 chunk 0
  EXPECT_EQ(s[2].first, 4);  // stage 0 chunk 1
  EXPECT_EQ(s[3].first, 6);  // stage 1 chunk 1
  ExpectContiguous(s, 8);
  EXPECT_EQ(DescribePartition(s, 2),
            "stage 0 chunk 0: embedding + layers 0-1 (2), stage 1 chunk 0: layers 2-3 (2), stage 0 "
            "chunk 1: layers 4-5 (2), stage 1 chunk 1: layers 6-7 (2) + head");
  Status st = PartitionStages("", Layers(10), 2, 2, &s);
  EXPECT_FALSE(st.ok());
  st = PartitionStages("uniform", Layers(8), 2, 2, &s);
  EXPECT_NE(st.message().find("cannot be combined with the interleaved schedule"),
            std::string::npos)
      << st.message();
}

TEST(StagePartitionTest, BloomsTypeTransformerOrEmbedding) {
  // tr11-176B: 70 layers over 12 stages with "type:transformer|embedding": the embedding and the
  // tied output layer weigh one layer each, so the first and last stage hold 5 layers, the rest 6.
  std::vector<StageLayers> s;
  ASSERT_TRUE(PartitionStages("type:transformer|embedding", Layers(70), 12, 1, &s).ok());
  EXPECT_EQ(Counts(s), (std::vector<int>{5, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 5}));
  ExpectContiguous(s, 70);
  // "type:transformer" alone (Megatron-DeepSpeed's default): layers only, filled greedily from
  // the front up to the smallest bottleneck (6), as DeepSpeed's partition_balanced did.
  ASSERT_TRUE(PartitionStages("type:transformer", Layers(70), 12, 1, &s).ok());
  EXPECT_EQ(Counts(s), (std::vector<int>{6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 4}));
  ExpectContiguous(s, 70);
  // Case-insensitive search, as DeepSpeed's re.search(..., re.IGNORECASE).
  ASSERT_TRUE(PartitionStages("type:TRANSFORMERLAYER", Layers(8), 2, 1, &s).ok());
  EXPECT_EQ(Counts(s), (std::vector<int>{4, 4}));
}

TEST(StagePartitionTest, UniformCountsEveryListItem) {
  // [embedding, 8 layers, final norm, head] = 11 items over 2 stages: 6 and 5, so stage 0 holds
  // the embedding and 5 layers, stage 1 3 layers, the norm and the head.
  std::vector<StageLayers> s;
  ASSERT_TRUE(PartitionStages("uniform", Layers(8), 2, 1, &s).ok());
  EXPECT_EQ(Counts(s), (std::vector<int>{5, 3}));
  ExpectContiguous(s, 8);
}

TEST(StagePartitionTest, ParametersWeighsTheEmbeddingAndHead) {
  // Embedding and head weigh 10 layers each: 24 layers over 4 stages balance at 11 layers' worth,
  // so the first and last stages hold 1 layer, the middle ones 11.
  std::vector<StageLayers> s;
  ASSERT_TRUE(PartitionStages("parameters", Layers(24), 4, 1, &s).ok());
  EXPECT_EQ(Counts(s), (std::vector<int>{1, 11, 11, 1}));
  ExpectContiguous(s, 24);
  // A GPT-2-small shape: the embedding (50304 x 768 + 1024 x 768) weighs ~5.6 layers.
  GptSpec spec;
  spec.num_layers = 12, spec.hidden = 768, spec.heads = 12, spec.ffn_hidden = 3072;
  spec.max_positions = 1024, spec.padded_vocab = 50304;
  const PartitionModel m = PartitionModelOf(spec);
  EXPECT_EQ(m.layer_params, 12 * 768 * 768 + 13 * 768);  // 7,087,872: Megatron's count
  EXPECT_EQ(m.embedding_params, (50304 + 1024) * 768);
  EXPECT_EQ(m.final_norm_params, 2 * 768);
  ASSERT_TRUE(PartitionStages("parameters", m, 2, 1, &s).ok());
  EXPECT_EQ(Counts(s), (std::vector<int>{6, 6}));
}

TEST(StagePartitionTest, RefusesWhatItCannotDo) {
  std::vector<StageLayers> s;
  Status st = PartitionStages("profile", Layers(8), 2, 1, &s);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("--pp-partition-method profile is not supported: keel has uniform, "
                              "parameters and type:REGEX"),
            std::string::npos)
      << st.message();
  st = PartitionStages("type:conv", Layers(8), 2, 1, &s);
  EXPECT_NE(st.message().find("matches none of the layer class names"), std::string::npos)
      << st.message();
  st = PartitionStages("type:(", Layers(8), 2, 1, &s);
  EXPECT_NE(st.message().find("is not a valid regular expression"), std::string::npos)
      << st.message();
  // Parameters with a heavy head: the last stage would get the head alone.
  PartitionModel heavy = Layers(4);
  heavy.head_params = 100000;
  st = PartitionStages("parameters", heavy, 2, 1, &s);
  EXPECT_NE(st.message().find("leaves pipeline stage 1 without a transformer layer (4 layers over "
                              "2 stages: 4, 0)"),
            std::string::npos)
      << st.message();
  st = PartitionStages("", Layers(3), 4, 1, &s);
  EXPECT_NE(st.message().find("3 layers cannot fill 4 pipeline stages"), std::string::npos)
      << st.message();
}

}  // namespace
}  // namespace keel

// The memory estimate a run checks before allocating (train/memory_estimate.h): its terms come
// from the model's own counts, and a run that does not fit is refused with the numbers and with
// what would fit: the largest micro-batch that splits the global batch, else how many layers.
#include "train/memory_estimate.h"

#include <gtest/gtest.h>

#include <vector>

#include "config/config.h"
#include "data/sample_prefetcher.h"
#include "model/gpt.h"

namespace keel {
namespace {

TrainConfig Validated(int layers, int micro, int global) {
  TrainConfig c;
  c.model.num_layers = layers;
  c.model.hidden = 64;
  c.model.heads = 4;
  c.seq_length = 64;
  c.micro_batch_size = micro;
  c.global_batch_size = global;
  c.train_iters = 10;
  c.lr_warmup_iters = 1;
  c.model.vocab = 1000;
  std::vector<std::string> notes;
  const Status st = Validate(&c, &notes);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return c;
}

TEST(MemoryEstimateTest, TermsComeFromTheModelsOwnCounts) {
  const TrainConfig c = Validated(2, 4, 32);
  const MemoryEstimate e = EstimateRunMemory(c);
  const GptSpec spec = c.model;
  EXPECT_EQ(e.params, GptModel::ParamCount(spec));
  EXPECT_EQ(e.weights, 4 * e.params);
  EXPECT_EQ(e.gradients, 4 * e.params);
  EXPECT_EQ(e.moments, 8 * e.params);
  EXPECT_EQ(e.activations, GptModel::ActivationBytes(spec, 4, 64));
  EXPECT_EQ(e.data, SamplePrefetcher::BufferBytes(65, SamplePrefetchDepth(c)) + 3 * 4 * 65 * 4);
  EXPECT_EQ(SamplePrefetchDepth(c), 64);  // two global batches
  EXPECT_EQ(e.total(), e.weights + e.gradients + e.moments + e.activations + e.data);
  EXPECT_TRUE(CheckMemoryFits(c, e, {e.total(), "test"}).ok());
}

TEST(MemoryEstimateTest, TooLargeAMicroBatchIsRefusedWithTheLargestThatFits) {
  const TrainConfig c = Validated(2, 16, 48);
  // Room for micro-batch 6 but not 8 (16 and 8 do not divide 48; 12 and 6 do).
  const uint64_t room = EstimateRunMemory(Validated(2, 6, 48)).total() + 1;
  ASSERT_LT(room, EstimateRunMemory(Validated(2, 8, 48)).total());
  const MemoryEstimate e = EstimateRunMemory(c);
  const Status st = CheckMemoryFits(c, e, {room, "MemAvailable in /proc/meminfo"});
  ASSERT_EQ(st.code(), Status::Code::kInvalidArgument);
  const std::string& m = st.message();
  EXPECT_NE(m.find("this run needs about " + FormatBytes(e.total()) + " of memory but " +
                   FormatBytes(room) + " is available (MemAvailable in /proc/meminfo)"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("activations " + FormatBytes(e.activations) + " (one micro-batch of 16 x 64"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("--micro-batch-size 6 fits"), std::string::npos) << m;
  EXPECT_NE(m.find("global batch of 48 stays"), std::string::npos) << m;
}

TEST(MemoryEstimateTest, TooLargeAModelIsRefusedWithTheLayersThatFit) {
  const TrainConfig c = Validated(1 << 30, 2, 8);  // ~53 TiB: the model itself does not fit
  const uint64_t room = EstimateRunMemory(Validated(40, 1, 8)).total() + 1;
  const Status st = CheckMemoryFits(c, EstimateRunMemory(c), {room, "test"});
  ASSERT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("even --micro-batch-size 1 does not fit; reduce --num-layers (at "
                              "most 40 fit at --hidden-size 64"),
            std::string::npos)
      << st.message();
  const Status none = CheckMemoryFits(c, EstimateRunMemory(c), {1000, "test"});
  EXPECT_NE(none.message().find("even one layer at --micro-batch-size 1 does not fit"),
            std::string::npos)
      << none.message();
}

TEST(MemoryEstimateTest, BytesReadAsPeopleWriteThem) {
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(uint64_t{300} << 20), "300 MiB");
  EXPECT_EQ(FormatBytes(uint64_t{53} << 40), "53.0 TiB");
}

}  // namespace
}  // namespace keel

// CheckParallelLayout: the rules `keel train` and `keel plan` share, each refused with the flag
// to change.
#include "config/parallel_layout.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

namespace keel {
namespace {

TrainConfig Config() {
  TrainConfig c;
  c.model.num_layers = 4, c.model.hidden = 64, c.model.heads = 4, c.model.ffn_hidden = 256;
  c.model.vocab = 1000;
  c.micro_batch_size = 2, c.global_batch_size = 16;
  c.make_vocab_size_divisible_by = 128;
  return c;
}

Status Check(const TrainConfig& c, int world, int t, int p, int v, ParallelLayout* l,
             std::vector<std::string>* notes) {
  return CheckParallelLayout(c, world, fmt::format("the {} ranks", world), t, p, v, l, notes);
}

TEST(ParallelLayoutTest, DerivesDataParallelSizeMicroBatchesAndPaddedVocab) {
  ParallelLayout l;
  std::vector<std::string> notes;
  ASSERT_TRUE(Check(Config(), 8, 2, 2, 0, &l, &notes).ok());
  EXPECT_EQ(l.data, 2);
  EXPECT_EQ(l.micro_batches, 4);    // 16 / (2 x 2)
  EXPECT_EQ(l.padded_vocab, 1024);  // a multiple of 128 x 2
  ASSERT_FALSE(notes.empty());
  EXPECT_NE(notes[0].find("padded to 1024"), std::string::npos) << notes[0];
}

TEST(ParallelLayoutTest, RefusesEachImpossibleLayoutNamingTheRule) {
  ParallelLayout l;
  std::vector<std::string> notes;
  auto refused = [&](const TrainConfig& c, int world, int t, int p, int v, const char* what) {
    const Status st = Check(c, world, t, p, v, &l, &notes);
    EXPECT_FALSE(st.ok()) << what;
    EXPECT_NE(st.message().find(what), std::string::npos) << st.message();
  };
  refused(Config(), 6, 4, 1, 0, "not a multiple of tensor parallel 4");
  refused(Config(), 8, 8, 1, 0, "must divide --num-attention-heads 4");
  TrainConfig gqa = Config();
  gqa.model.SetKvHeads(2);
  refused(gqa, 4, 4, 1, 0, "must divide --num-query-groups 2");
  refused(Config(), 8, 1, 8, 0, "larger than --num-layers 4");
  refused(Config(), 12, 1, 1, 0, "--global-batch-size 16 is not divisible");
  TrainConfig padded = Config();
  padded.pad_vocab_size_to = 1001;
  refused(padded, 2, 2, 1, 0, "--pad-vocab-size-to 1001 is not a multiple");
  refused(Config(), 2, 1, 2, 4, "is not pipeline size 2 x a multiple");
  refused(Config(), 2, 1, 1, 1, "needs --pipeline-model-parallel-size of at least 2");
  TrainConfig few = Config();
  few.global_batch_size = 6;  // 3 micro-batches for 2 stages
  refused(few, 2, 1, 2, 1, "multiple of the pipeline size 2");
}

TEST(ParallelLayoutTest, InterleavingCountsChunksAndASmallBatchIsNoted) {
  ParallelLayout l;
  std::vector<std::string> notes;
  ASSERT_TRUE(Check(Config(), 2, 1, 2, 1, &l, &notes).ok());
  EXPECT_EQ(l.virtual_stages, 2);  // 4 layers / 2 stages / 1 layer per chunk
  TrainConfig small = Config();
  small.global_batch_size = 2;  // one micro-batch for 2 stages
  notes.clear();
  ASSERT_TRUE(Check(small, 2, 1, 2, 0, &l, &notes).ok());
  ASSERT_FALSE(notes.empty());
  EXPECT_NE(notes.back().find("never full"), std::string::npos) << notes.back();
}

}  // namespace
}  // namespace keel

#include "data/gpt_dataset.h"

#include <gtest/gtest.h>

#include <numeric>
#include <set>

#include "data/indexed_dataset.h"
#include "data_test_util.h"

namespace keel {
namespace {

using datatest::TempDir;

// A dataset whose token at stream position p is p, so a sample shows where it was cut from.
class GptDatasetTest : public ::testing::Test {
 protected:
  void Build(const std::vector<int>& doc_lengths) {
    IndexedDatasetWriter writer(Env::Default(), dir_.Join("ds"), 65535);
    ASSERT_TRUE(writer.Open().ok());
    int32_t next = 0;
    for (int len : doc_lengths) {
      std::vector<int32_t> doc(len);
      std::iota(doc.begin(), doc.end(), next);
      next += len;
      ASSERT_TRUE(writer.AddDocument(doc).ok());
    }
    ASSERT_TRUE(writer.Finish(DatasetMeta{}).ok());
    Status st = IndexedDataset::Open(Env::Default(), dir_.Join("ds"), &data_);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  std::unique_ptr<GptDataset> Make(const std::string& split, Split which, int seq, uint64_t seed) {
    std::unique_ptr<GptDataset> ds;
    Status st = GptDataset::Create(data_.get(), split, which, seq, seed, &ds);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return ds;
  }
  TempDir dir_;
  std::unique_ptr<IndexedDataset> data_;
};

TEST(ParseSplit, AcceptsMegatronForms) {
  double w[3];
  ASSERT_TRUE(ParseSplit("969,30,1", w).ok());
  EXPECT_EQ(w[0], 969);
  EXPECT_EQ(w[1], 30);
  EXPECT_EQ(w[2], 1);
  ASSERT_TRUE(ParseSplit("90/10", w).ok());
  EXPECT_EQ(w[0], 90);
  EXPECT_EQ(w[1], 10);
  EXPECT_EQ(w[2], 0);
  ASSERT_TRUE(ParseSplit("0.8,0.2,0", w).ok());
  EXPECT_DOUBLE_EQ(w[0], 0.8);
}

TEST(ParseSplit, RejectsNonsense) {
  double w[3];
  for (const char* bad : {"", "a,b,c", "1,,2", "-1,2,3", "0,0,0", "1,2,3,4", "1,2,", "inf,1,1"}) {
    Status st = ParseSplit(bad, w);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find(std::string("'") + bad + "'"), std::string::npos) << st.ToString();
  }
}

TEST(PermuteSample, IsAPermutationForAwkwardSizes) {
  for (int64_t n : {1, 2, 3, 5, 16, 17, 100, 1000, 4097}) {
    std::vector<bool> seen(n, false);
    for (int64_t k = 0; k < n; ++k) {
      int64_t j = PermuteSample(k, n, 1234, Split::kTrain, 0);
      ASSERT_TRUE(j >= 0 && j < n) << n;
      ASSERT_FALSE(seen[j]) << "n=" << n << " repeats " << j;
      seen[j] = true;
    }
  }
}

TEST(PermuteSample, DeterministicAndKeyedBySeedSplitAndEpoch) {
  constexpr int64_t n = 1000;
  auto order = [&](uint64_t seed, Split split, int64_t epoch) {
    std::vector<int64_t> o(n);
    for (int64_t k = 0; k < n; ++k) o[k] = PermuteSample(k, n, seed, split, epoch);
    return o;
  };
  const std::vector<int64_t> base = order(1234, Split::kTrain, 0);
  EXPECT_EQ(base, order(1234, Split::kTrain, 0));
  EXPECT_NE(base, order(1234, Split::kTrain, 1));
  EXPECT_NE(base, order(1235, Split::kTrain, 0));
  EXPECT_NE(base, order(1234, Split::kValid, 0));
  std::vector<int64_t> identity(n);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_NE(base, identity);
  // Shuffled, not merely rotated: few positions keep their neighbour.
  int adjacent = 0;
  for (int64_t k = 0; k + 1 < n; ++k) adjacent += base[k + 1] == base[k] + 1;
  EXPECT_LT(adjacent, 20);
}

TEST_F(GptDatasetTest, SamplesAreOverlappingStreamSlicesInPermutedOrder) {
  Build({10, 3, 0, 25, 7});  // 45 tokens
  constexpr int kSeq = 4;
  auto ds = Make("1,0,0", Split::kTrain, kSeq, 99);
  EXPECT_EQ(ds->NumTokens(), 45);
  EXPECT_EQ(ds->SamplesPerEpoch(), (45 - 1) / kSeq);
  const int64_t n = ds->SamplesPerEpoch();
  std::vector<int32_t> sample(kSeq + 1);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    std::set<int32_t> starts;
    for (int64_t k = 0; k < n; ++k) {
      const int64_t index = epoch * n + k;
      EXPECT_EQ(ds->EpochOf(index), epoch);
      // SampleStart says where the sample is cut from (token p of the stream is p here).
      EXPECT_EQ(ds->GetSample(index, sample.data()), ds->SampleStart(index));
      EXPECT_EQ(ds->SampleStart(index), sample[0]);
      const int64_t j = PermuteSample(k, n, 99, Split::kTrain, epoch);
      for (int t = 0; t <= kSeq; ++t) EXPECT_EQ(sample[t], j * kSeq + t);
      starts.insert(sample[0]);
    }
    EXPECT_EQ(starts.size(), static_cast<size_t>(n));  // every sample once per epoch
  }
}

TEST_F(GptDatasetTest, SplitsAreWholeDocumentsInOrder) {
  Build({10, 10, 10, 10, 10, 10, 10, 10, 10, 10});
  auto train = Make("8,1,1", Split::kTrain, 3, 1);
  auto valid = Make("8,1,1", Split::kValid, 3, 1);
  auto test = Make("8,1,1", Split::kTest, 3, 1);
  EXPECT_EQ(train->NumTokens(), 80);
  EXPECT_EQ(valid->NumTokens(), 10);
  EXPECT_EQ(test->NumTokens(), 10);
  EXPECT_EQ(valid->SamplesPerEpoch(), 3);
  std::vector<int32_t> sample(4);
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(valid->GetSample(i, sample.data()), sample[0]);  // a position of the whole stream
    EXPECT_GE(sample[0], 80);
    EXPECT_LT(sample[3], 90);
    test->GetSample(i, sample.data());
    EXPECT_GE(sample[0], 90);
  }
}

TEST_F(GptDatasetTest, MegatronRoundingOfTheDefaultSplit) {
  Build(std::vector<int>(139, 20));  // Moby-Dick's document count
  auto train = Make("969,30,1", Split::kTrain, 8, 1);
  auto valid = Make("969,30,1", Split::kValid, 8, 1);
  // round(134.7) = 135, round(4.17) = 4, round(0.139) = 0.
  EXPECT_EQ(train->NumTokens(), 135 * 20);
  EXPECT_EQ(valid->NumTokens(), 4 * 20);
  std::unique_ptr<GptDataset> test;
  Status st = GptDataset::Create(data_.get(), "969,30,1", Split::kTest, 8, 1, &test);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("test split (documents [139, 139) of 139"), std::string::npos)
      << st.ToString();
  EXPECT_NE(st.message().find("is empty"), std::string::npos) << st.ToString();
}

TEST_F(GptDatasetTest, ErrorsForEmptyTrainAndShortSplits) {
  Build({10, 10, 10, 10});
  std::unique_ptr<GptDataset> ds;
  Status st = GptDataset::Create(data_.get(), "0,1,0", Split::kTrain, 4, 1, &ds);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("train split"), std::string::npos) << st.ToString();
  st = GptDataset::Create(data_.get(), "3,1,0", Split::kValid, 10, 1, &ds);  // 10 < 11 tokens
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("fewer than one sample"), std::string::npos) << st.ToString();
  EXPECT_TRUE(GptDataset::Create(data_.get(), "3,1,0", Split::kValid, 9, 1, &ds).ok());
  EXPECT_EQ(ds->SamplesPerEpoch(), 1);
  EXPECT_FALSE(GptDataset::Create(data_.get(), "1,0,0", Split::kTrain, 0, 1, &ds).ok());
  EXPECT_FALSE(GptDataset::Create(data_.get(), "x", Split::kTrain, 4, 1, &ds).ok());
}

}  // namespace
}  // namespace keel

// BlendedDataset: exact, stable mixtures. Every window of N positions holds each dataset within 2
// of its share; positions are a pure function of k whatever the access order; weights are
// normalised; bad weights and bad --data-path syntax are refused with the fix.
#include "data/blended_dataset.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/rng.h"

namespace keel {
namespace {

void ExpectWindowsWithinBound(const std::vector<double>& weights) {
  BlendedDataset b;
  ASSERT_TRUE(BlendedDataset::Create(weights, "test", &b).ok());
  const int64_t total = 50000;
  std::vector<int> seq(total);
  std::vector<int64_t> seen(weights.size(), 0);
  for (int64_t k = 0; k < total; ++k) {
    auto [d, i] = b.Locate(k);
    seq[k] = d;
    EXPECT_EQ(i, seen[d]) << "samples of a dataset are consecutive";
    ++seen[d];
  }
  double sum = 0;
  for (double w : weights) sum += w;
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t a = static_cast<int64_t>(U64At({5, RngPurpose::kTest, 0}, trial) % total);
    const int64_t n = 1 + static_cast<int64_t>(U64At({5, RngPurpose::kTest, 1}, trial) %
                                               static_cast<uint64_t>(total - a));
    std::vector<int64_t> c(weights.size(), 0);
    for (int64_t k = a; k < a + n; ++k) ++c[seq[k]];
    for (size_t d = 0; d < weights.size(); ++d)
      ASSERT_LT(std::fabs(static_cast<double>(c[d]) - weights[d] / sum * n), 2.0)
          << "dataset " << d << " window [" << a << ", " << a + n << ")";
  }
}

TEST(BlendedDatasetTest, EveryWindowHoldsEachShareWithinTwoSamples) {
  ExpectWindowsWithinBound({0.7, 0.3});
  ExpectWindowsWithinBound({2, 1, 1});  // normalised to 0.5 0.25 0.25
  ExpectWindowsWithinBound({0.123, 0.456, 0.421});
  ExpectWindowsWithinBound({1, 0});  // a zero weight is never read
}

TEST(BlendedDatasetTest, PositionsArePureFunctionsOfKInAnyAccessOrder) {
  BlendedDataset seq, jumpy;
  ASSERT_TRUE(BlendedDataset::Create({0.6, 0.25, 0.15}, "t", &seq).ok());
  ASSERT_TRUE(BlendedDataset::Create({0.6, 0.25, 0.15}, "t", &jumpy).ok());
  std::vector<std::pair<int, int64_t>> want;
  for (int64_t k = 0; k < 30000; ++k) want.push_back(seq.Locate(k));
  for (int t = 0; t < 2000; ++t) {
    const int64_t k = static_cast<int64_t>(U64At({9, RngPurpose::kTest, 0}, t) % 30000);
    ASSERT_EQ(jumpy.Locate(k), want[k]) << k;
  }
  for (int64_t k = 29999; k >= 29000; --k) ASSERT_EQ(jumpy.Locate(k), want[k]) << k;
}

TEST(BlendedDatasetTest, BadWeightsAndSyntaxAreRefused) {
  BlendedDataset b;
  Status st = BlendedDataset::Create({0.5, -1}, "--data-path", &b);
  EXPECT_NE(st.message().find("--data-path: weight -1"), std::string::npos) << st.message();
  st = BlendedDataset::Create({0, 0}, "--data-path", &b);
  EXPECT_NE(st.message().find("sum to 0"), std::string::npos) << st.message();
  EXPECT_FALSE(BlendedDataset::Create({NAN, 1}, "x", &b).ok());

  std::vector<std::pair<double, std::string>> blend;
  ASSERT_TRUE(ParseDataBlend({"data/a"}, &blend).ok());
  EXPECT_EQ(blend, (std::vector<std::pair<double, std::string>>{{1.0, "data/a"}}));
  ASSERT_TRUE(ParseDataBlend({"0.7", "cm4", "0.3", "pmd"}, &blend).ok());
  EXPECT_EQ(blend[1], (std::pair<double, std::string>{0.3, "pmd"}));
  st = ParseDataBlend({"0.7", "cm4", "0.3"}, &blend);
  EXPECT_NE(st.message().find("WEIGHT PREFIX pairs"), std::string::npos) << st.message();
  st = ParseDataBlend({"cm4", "0.7"}, &blend);
  EXPECT_NE(st.message().find("'cm4' (before '0.7') is not a weight"), std::string::npos)
      << st.message();
}

}  // namespace
}  // namespace keel

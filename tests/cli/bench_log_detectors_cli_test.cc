// `keel bench log-detectors --quick`: the analyzer's delays and false reports on synthetic logs.
#include <gtest/gtest.h>

#include "keel_process.h"

namespace {

using keel_test::RunKeelShell;

TEST(BenchLogDetectorsCli, QuickRunFindsTheDivergenceInTimeAndNothingOnHealthyLogs) {
  const auto r = RunKeelShell("", "bench log-detectors --quick");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("divergence +5%/500 it  megatron-lm"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("divergence +5%/500 it  megatron-deepspeed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("divergence reported within 200 iterations of its start on every log: yes"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("false reports on 8 healthy logs: 0"), std::string::npos) << r.out;
}

TEST(BenchLogDetectorsCli, BadOptionIsAUsageError) {
  const auto r = RunKeelShell("", "bench log-detectors --seeds 0");
  EXPECT_EQ(r.code, 2) << r.out;
}

}  // namespace

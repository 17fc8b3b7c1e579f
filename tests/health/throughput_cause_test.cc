// DropCause (health/throughput_cause.h): a slower loader, another process on the cores and the
// process's own work read differently; saves are named; nothing is said without a rise.
#include "health/throughput_cause.h"

#include <gtest/gtest.h>

namespace keel {
namespace {

TEST(ThroughputCauseTest, EachVisibleCauseReadsDifferently) {
  const IterationCost before{0.100, 0.095, 0.005};
  // The data wait took the whole rise: the loader starves.
  std::string c = DropCause(before, {0.160, 0.096, 0.064}, 0, 0);
  EXPECT_NE(c.find("waited longer for data: 64.0 ms per iteration for its samples, was 5.0"),
            std::string::npos)
      << c;
  // Same CPU time, longer iterations: off the cores (another process, or a wait).
  c = DropCause(before, {0.160, 0.096, 0.005}, 0, 0);
  EXPECT_NE(c.find("off the cores: its CPU time per iteration stayed at 96.0 ms (was 95.0) while "
                   "an iteration took 160.0 ms (was 100.0)"),
            std::string::npos)
      << c;
  // The CPU time rose with the wall time: the process's own work.
  c = DropCause(before, {0.160, 0.150, 0.005}, 0, 0);
  EXPECT_NE(c.find("own work grew: its CPU time per iteration rose from 95.0 to 150.0 ms"),
            std::string::npos)
      << c;
  // Saves since the drop began are named, alone or after a cause.
  c = DropCause(before, {0.160, 0.096, 0.005}, 2, 12.5);
  EXPECT_NE(c.find("off the cores"), std::string::npos) << c;
  EXPECT_NE(c.find("; 2 saves (12.5 s) since it began"), std::string::npos) << c;
  EXPECT_EQ(DropCause(before, before, 1, 3),
            "1 save (3.0 s) since it began: a save's writes can "
            "slow the iterations after it");
  // No rise, or too little known: nothing to say.
  EXPECT_EQ(DropCause(before, before, 0, 0), "");
  EXPECT_EQ(DropCause(IterationCost{}, {0.160, 0.096, 0.005}, 0, 0), "");
}

}  // namespace
}  // namespace keel

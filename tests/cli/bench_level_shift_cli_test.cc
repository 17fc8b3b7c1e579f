// `keel bench level-shift --quick` (issue 36): the table of delays against a slowdown's size and
// the noise, every slowdown found, no false drop or return; a bad option is a usage error.
#include <gtest/gtest.h>

#include "keel_process.h"

namespace keel {
namespace {

TEST(BenchLevelShiftCliTest, QuickTableFindsEverySlowdownAndNoFalseDrop) {
  const keel_test::KeelResult r = keel_test::RunKeelShell("", "bench level-shift --quick");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("median delay"), std::string::npos) << r.out;
  // The 2%-under-2%-noise row (the hardest) and the healthy table's 2% row.
  EXPECT_NE(r.out.find("    2%     2%       4/4"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("false drops on healthy series (3000 iterations each"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("missed slowdowns: 0; false drops before a slowdown: 0; false returns of a "
                       "slowdown (in the 3000 iterations after it began): 0; false drops on "
                       "healthy series: 0"),
            std::string::npos)
      << r.out;
}

TEST(BenchLevelShiftCliTest, BadOptionIsAUsageError) {
  const keel_test::KeelResult r = keel_test::RunKeelShell("", "bench level-shift --seeds 0");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--seeds"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace keel

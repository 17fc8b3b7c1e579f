// KEEL_TRAIN_FAULTS's host= key and KEEL_TEST_HOSTNAME: a fault armed on a host, whatever rank
// runs there, so that keel launch's tests fail a "machine" wherever the ranks are placed.
#include <gtest/gtest.h>
#include <stdlib.h>

#include "core/host_name.h"
#include "train/test_hooks.h"
#include "train/trainer.h"

namespace keel {
namespace {

class TestHooksHostTest : public ::testing::Test {
 protected:
  void TearDown() override {
    unsetenv("KEEL_TEST_HOSTNAME");
    unsetenv("KEEL_TRAIN_FAULTS");
    OverrideHostNameForTesting("");
  }
  TestHooks Parse(const char* host, const char* faults) {
    setenv("KEEL_TEST_HOSTNAME", host, 1);
    setenv("KEEL_TRAIN_FAULTS", faults, 1);
    TestHooks h;
    EXPECT_TRUE(TestHooks::FromEnvironment(Env::Default(), &h).ok());
    return h;
  }
};

TEST_F(TestHooksHostTest, AHostFaultIsArmedOnThatHostForWhicheverRankRunsThere) {
  TestHooks h = Parse("n2", "hang=30:host=n2,kill=5:host=n3,bitflip=7:host=n2:rank=4");
  EXPECT_EQ(ThisHostName(), "n2");
  ASSERT_EQ(h.rank_faults.size(), 2u);
  EXPECT_EQ(h.rank_faults[0].kind, RankFault::Kind::kHang);
  EXPECT_EQ(h.rank_faults[0].rank, -1);  // any rank of this process
  EXPECT_NE(h.TrainerFaultsFor(0, nullptr), nullptr);
  EXPECT_NE(h.TrainerFaultsFor(2, nullptr), nullptr);
  EXPECT_TRUE(h.BitFlipAt(4, 7));  // host and rank both given: both must match
  EXPECT_FALSE(h.BitFlipAt(1, 7));

  h = Parse("n1", "hang=30:host=n2,slow=0.1:host=n2");
  EXPECT_TRUE(h.rank_faults.empty());
  EXPECT_EQ(h.TrainerFaultsFor(0, nullptr), nullptr);
}

TEST_F(TestHooksHostTest, WithoutTheOverrideTheHostIsTheMachines) {
  unsetenv("KEEL_TEST_HOSTNAME");
  EXPECT_FALSE(ThisHostName().empty());
  EXPECT_NE(ThisHostName(), "n2");
}

}  // namespace
}  // namespace keel

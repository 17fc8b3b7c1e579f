#include "core/subprocess.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <vector>

namespace keel {
namespace {

TEST(SubprocessTest, EnvironmentWithReplacesTheNamesItSetsAndAddsThemLast) {
  setenv("KEEL_SUBPROCESS_TEST_A", "old", 1);
  setenv("KEEL_SUBPROCESS_TEST_B", "kept", 1);
  const std::vector<std::string> env =
      EnvironmentWith({"KEEL_SUBPROCESS_TEST_A=new", "KEEL_SUBPROCESS_TEST_C=x=y"});
  unsetenv("KEEL_SUBPROCESS_TEST_A");
  unsetenv("KEEL_SUBPROCESS_TEST_B");
  ASSERT_GE(env.size(), 3u);
  EXPECT_EQ(env[env.size() - 2], "KEEL_SUBPROCESS_TEST_A=new");
  EXPECT_EQ(env.back(), "KEEL_SUBPROCESS_TEST_C=x=y");
  EXPECT_EQ(std::count(env.begin(), env.end(), "KEEL_SUBPROCESS_TEST_A=old"), 0);
  EXPECT_EQ(std::count(env.begin(), env.end(), "KEEL_SUBPROCESS_TEST_B=kept"), 1);
}

TEST(SubprocessTest, ExecVectorsAreNullTerminatedCopies) {
  const ExecVectors exec({"sh", "-c", "true"}, {"A=1"});
  ASSERT_NE(exec.argv()[2], nullptr);
  EXPECT_STREQ(exec.argv()[0], "sh");
  EXPECT_STREQ(exec.argv()[2], "true");
  EXPECT_EQ(exec.argv()[3], nullptr);
  EXPECT_STREQ(exec.envp()[0], "A=1");
  EXPECT_EQ(exec.envp()[1], nullptr);
}

}  // namespace
}  // namespace keel

// ExitCodeFor / Fail (src/cli/exit_code.h): the one mapping from a failed Status to keel's exit
// codes (core/exit_code.h), and the codes' meanings as keel launch reports them.
#include "cli/exit_code.h"

#include <gtest/gtest.h>

#include "launch/supervisor.h"

namespace keel::cli {
namespace {

TEST(ExitCodeTest, UsageErrorsAreTwoRuntimeFailuresOne) {
  EXPECT_EQ(ToInt(ExitCodeFor(Status::OK())), 0);
  EXPECT_EQ(ToInt(ExitCodeFor(Status::InvalidArgument("bad flag"))), 2);
  EXPECT_EQ(ToInt(ExitCodeFor(Status::IOError("disk full"))), 1);
  EXPECT_EQ(ToInt(ExitCodeFor(Status::Corruption("bad checksum"))), 1);
  EXPECT_EQ(ToInt(ExitCodeFor(Status::Internal("bug"))), 1);
  EXPECT_EQ(ToInt(ExitCodeFor(Status::OutOfMemory("building the model"))), 1);
  // NotFound is a runtime failure unless the command says the missing thing is the user's path.
  EXPECT_EQ(ToInt(ExitCodeFor(Status::NotFound("gone"))), 1);
  EXPECT_EQ(ToInt(ExitCodeFor(Status::NotFound("no such run"), NotFoundIs::kUsageError)), 2);
  EXPECT_EQ(ToInt(ExitCodeFor(Status::IOError("disk full"), NotFoundIs::kUsageError)), 1);
}

TEST(ExitCodeTest, FailLogsTheMessageAsAnErrorLine) {
  ::testing::internal::CaptureStderr();
  const int rc = Fail(Status::InvalidArgument("--lr must be positive"));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(rc, 2);
  EXPECT_EQ(err, "error: --lr must be positive\n");
}

TEST(ExitCodeTest, OutOfMemoryIsItsOwnStatusCode) {
  const Status st = Status::OutOfMemory("while building the model");
  EXPECT_EQ(st.code(), Status::Code::kOutOfMemory);
  EXPECT_EQ(st.ToString(), "out of memory: while building the model");
}

// The table of the README: every code keel gives has a meaning, and keel launch restarts exactly
// the codes that say a restart can help (1 and 4), never 2 or 3.
TEST(ExitCodeTest, EveryCodeHasAMeaningAndLaunchRestartsOnlyOneAndFour) {
  for (ExitCode c : {ExitCode::kSuccess, ExitCode::kRuntimeFailure, ExitCode::kUsageError,
                     ExitCode::kGuardStopped, ExitCode::kRanksCannotGoOn})
    EXPECT_NE(ExitCodeMeaning(ToInt(c)), nullptr) << ToInt(c);
  EXPECT_EQ(ExitCodeMeaning(5), nullptr);
  EXPECT_EQ(ExitCodeMeaning(137), nullptr);
  auto verdict = [](ExitCode c) {
    ChildExit e;
    e.code = ToInt(c);
    return JudgeExit(e);
  };
  EXPECT_EQ(verdict(ExitCode::kSuccess), ChildVerdict::kFinished);
  EXPECT_EQ(verdict(ExitCode::kRuntimeFailure), ChildVerdict::kRestart);
  EXPECT_EQ(verdict(ExitCode::kUsageError), ChildVerdict::kConfigError);
  EXPECT_EQ(verdict(ExitCode::kGuardStopped), ChildVerdict::kGuardStopped);
  EXPECT_EQ(verdict(ExitCode::kRanksCannotGoOn), ChildVerdict::kRestart);
  ChildExit e;
  e.code = 4;
  EXPECT_EQ(DescribeExit(e),
            "exit 4 (the ranks could not go on together: a hang or collectives out of step)");
}

}  // namespace
}  // namespace keel::cli

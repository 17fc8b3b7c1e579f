// ExitCode / Fail (src/cli/exit_code.h): the one mapping from a failed Status to keel's exit codes
// (0 success, 1 runtime failure, 2 usage or configuration error).
#include "cli/exit_code.h"

#include <gtest/gtest.h>

namespace keel::cli {
namespace {

TEST(ExitCodeTest, UsageErrorsAreTwoRuntimeFailuresOne) {
  EXPECT_EQ(ExitCode(Status::OK()), 0);
  EXPECT_EQ(ExitCode(Status::InvalidArgument("bad flag")), 2);
  EXPECT_EQ(ExitCode(Status::IOError("disk full")), 1);
  EXPECT_EQ(ExitCode(Status::Corruption("bad checksum")), 1);
  EXPECT_EQ(ExitCode(Status::Internal("bug")), 1);
  // NotFound is a runtime failure unless the command says the missing thing is the user's path.
  EXPECT_EQ(ExitCode(Status::NotFound("gone")), 1);
  EXPECT_EQ(ExitCode(Status::NotFound("no such run"), NotFoundIs::kUsageError), 2);
  EXPECT_EQ(ExitCode(Status::IOError("disk full"), NotFoundIs::kUsageError), 1);
}

TEST(ExitCodeTest, FailLogsTheMessageAsAnErrorLine) {
  ::testing::internal::CaptureStderr();
  const int rc = Fail(Status::InvalidArgument("--lr must be positive"));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(rc, 2);
  EXPECT_EQ(err, "error: --lr must be positive\n");
}

}  // namespace
}  // namespace keel::cli

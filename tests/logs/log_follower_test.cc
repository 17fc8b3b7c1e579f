// LogFollower on files another process writes: appends and partial lines, a file not there yet,
// truncation, rotation by rename (with the lines the old file got after the last look),
// copytruncate (and the NUL hole it leaves), a replacement that grew past the read position; and on
// an Env that is not the disk.
#include "logs/log_follower.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../../fuzz/mem_env.h"
#include "../cli/keel_process.h"

namespace keel {
namespace {

namespace fs = std::filesystem;
using Kind = FollowedItem::Kind;

void Append(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::app | std::ios::binary) << text;
}

// What a Poll returned, one string per item: "line", "+new file: ...", "note: ...".
std::vector<std::string> PollAll(LogFollower* f) {
  std::vector<std::string> out;
  bool more = true;
  while (more) {
    std::vector<FollowedItem> items;
    Status st = f->Poll(&items, &more);
    EXPECT_TRUE(st.ok()) << st.message();
    for (const FollowedItem& i : items)
      out.push_back(i.kind == Kind::kLine      ? i.text
                    : i.kind == Kind::kNewFile ? "+new file: " + i.text
                                               : "note: " + i.text);
  }
  return out;
}

std::vector<std::string> Lines(const std::vector<std::string>& items) {
  std::vector<std::string> out;
  for (const std::string& s : items)
    if (s.rfind("note: ", 0) != 0 && s.rfind("+new file: ", 0) != 0) out.push_back(s);
  return out;
}

bool Has(const std::vector<std::string>& items, const std::string& part) {
  for (const std::string& s : items)
    if (s.find(part) != std::string::npos) return true;
  return false;
}

class LogFollowerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = keel_test::FreshTempDir("log_follower");
    path_ = dir_ + "/main_log.txt";
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_, path_;
};

TEST_F(LogFollowerTest, AppendsArriveAsWholeLines) {
  LogFollower f(Env::Default(), path_);
  Append(path_, "first\nsecond half");
  EXPECT_EQ(PollAll(&f), (std::vector<std::string>{"first"}));
  EXPECT_TRUE(PollAll(&f).empty());  // the partial line waits
  Append(path_, " of it\r\nthird\n");
  EXPECT_EQ(PollAll(&f), (std::vector<std::string>{"second half of it\r", "third"}));
  Append(path_, "last, never finished");
  EXPECT_TRUE(PollAll(&f).empty());
  std::string partial;
  ASSERT_TRUE(f.TakePartialLine(&partial));
  EXPECT_EQ(partial, "last, never finished");
  EXPECT_EQ(f.files(), 1);
}

TEST_F(LogFollowerTest, AFileNotThereYetIsWaitedFor) {
  LogFollower f(Env::Default(), path_);
  auto items = PollAll(&f);
  ASSERT_EQ(items.size(), 1u);
  EXPECT_NE(items[0].find("does not exist yet: waiting for it"), std::string::npos) << items[0];
  EXPECT_TRUE(PollAll(&f).empty());  // said once
  Append(path_, "hello\n");
  items = PollAll(&f);
  EXPECT_TRUE(Has(items, "appeared"));
  EXPECT_EQ(Lines(items), (std::vector<std::string>{"hello"}));
}

TEST_F(LogFollowerTest, TruncationStartsOverAtTheNewStart) {
  LogFollower f(Env::Default(), path_);
  Append(path_, "one\ntwo\nthree\n");
  EXPECT_EQ(PollAll(&f).size(), 3u);
  fs::resize_file(path_, 0);  // `> main_log.txt`
  Append(path_, "again\n");
  const auto items = PollAll(&f);
  EXPECT_TRUE(Has(items, "+new file: " + path_ + " is shorter (6 bytes) than the 14 bytes read"));
  EXPECT_EQ(Lines(items), (std::vector<std::string>{"again"}));
  EXPECT_EQ(f.files(), 2);
}

// logrotate's default: rename, then a new file. What the old file got after the last look (and
// the end of a line it was writing) is read from its new name before the new file.
TEST_F(LogFollowerTest, RotationByRenameReadsTheOldFilesLastLinesFirst) {
  LogFollower f(Env::Default(), path_);
  Append(path_, "a\nb\n");
  EXPECT_EQ(PollAll(&f).size(), 2u);
  Append(path_, "c\nd wri");
  EXPECT_EQ(Lines(PollAll(&f)), (std::vector<std::string>{"c"}));
  Append(path_, "tten late\ne\n");
  fs::rename(path_, path_ + ".1");
  Append(path_ + ".2", "an older rotation\n");  // not the file that was read: left alone
  Append(path_, "new 1\nnew 2\n");
  const auto items = PollAll(&f);
  EXPECT_EQ(Lines(items), (std::vector<std::string>{"d written late", "e", "new 1", "new 2"}));
  EXPECT_TRUE(Has(items, "from " + path_ + ".1"));
  EXPECT_TRUE(Has(items, "+new file: " + path_ + " is another file now"));
}

// Between the rename and the new file, the path does not exist: the old file's last lines are read
// then, and the new file when it comes.
TEST_F(LogFollowerTest, RotationWithTheNewFileLateIsWaitedFor) {
  LogFollower f(Env::Default(), path_);
  Append(path_, "a\n");
  PollAll(&f);
  Append(path_, "b\n");
  fs::rename(path_, path_ + "-20240501");
  auto items = PollAll(&f);
  EXPECT_EQ(Lines(items), (std::vector<std::string>{"b"}));
  EXPECT_TRUE(Has(items, "is gone (rotated or removed)"));
  EXPECT_TRUE(PollAll(&f).empty());
  Append(path_, "c\n");
  items = PollAll(&f);
  EXPECT_EQ(Lines(items), (std::vector<std::string>{"c"}));
  EXPECT_TRUE(Has(items, "+new file: " + path_ + " is back"));
}

// copytruncate: the file is copied to PATH.1 and cut to nothing; a writer without O_APPEND writes
// on at its old offset, leaving a hole of NUL bytes.
TEST_F(LogFollowerTest, CopytruncateReadsTheCopyThenTheNewContentWithoutTheHole) {
  LogFollower f(Env::Default(), path_);
  Append(path_, "x1\nx2\n");
  PollAll(&f);
  Append(path_, "x3\n");
  fs::copy_file(path_, path_ + ".1");
  fs::resize_file(path_, 0);
  Append(path_, std::string(9, '\0') + "y1\n");
  const auto items = PollAll(&f);
  EXPECT_EQ(Lines(items), (std::vector<std::string>{"x3", "y1"}));
  EXPECT_TRUE(Has(items, "NUL bytes dropped"));
}

// A new file that already holds more than was read of the old one is told apart by its content.
TEST_F(LogFollowerTest, AReplacementLongerThanWhatWasReadIsANewFile) {
  LogFollower f(Env::Default(), path_);
  Append(path_, "old 1\nold 2\n");
  PollAll(&f);
  fs::remove(path_);
  Append(path_, "fresh 1\nfresh 2\nfresh 3\n");
  const auto items = PollAll(&f);
  EXPECT_EQ(Lines(items), (std::vector<std::string>{"fresh 1", "fresh 2", "fresh 3"}));
  EXPECT_TRUE(Has(items, "+new file: "));
}

TEST_F(LogFollowerTest, ADirectoryIsAnError) {
  LogFollower f(Env::Default(), dir_);
  std::vector<FollowedItem> items;
  bool more = false;
  const Status st = f.Poll(&items, &more);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("is a directory, not a log file"), std::string::npos);
}

// Everything goes through the Env: an in-memory one works the same.
TEST(LogFollowerMemEnvTest, FollowsAFileInMemory) {
  fuzz::MemEnv env;
  LogFollower f(&env, "/logs/main_log.txt");
  EXPECT_TRUE(Has(PollAll(&f), "does not exist yet"));
  env.Put("/logs/main_log.txt", "iteration 1\niteration");
  EXPECT_EQ(Lines(PollAll(&f)), (std::vector<std::string>{"iteration 1"}));
  env.Put("/logs/main_log.txt", "iteration 1\niteration 2\n");
  EXPECT_EQ(Lines(PollAll(&f)), (std::vector<std::string>{"iteration 2"}));
  ASSERT_TRUE(env.RenameFile("/logs/main_log.txt", "/logs/main_log.txt.1").ok());
  env.Put("/logs/main_log.txt", "iteration 3\n");
  EXPECT_EQ(Lines(PollAll(&f)), (std::vector<std::string>{"iteration 3"}));
}

}  // namespace
}  // namespace keel

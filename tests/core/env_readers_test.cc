// Issue 35: the Env's readers cannot be stalled or exhausted. A FIFO given where a file is
// expected blocked open(2) for good (deaf to SIGINT); /dev/zero grew memory without bound; a file
// of any size was read whole. Every whole-file read is now of a regular file, under a cap that the
// message states.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "core/env.h"
#include "core/fault_injection_env.h"

namespace keel {
namespace {

namespace fs = std::filesystem;

class EnvReadersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("keel_env_readers_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

// A FIFO with a writer that opens it (blocking until a reader does) and closes it at once: the
// old readers opened it and read it as an empty file; without a writer they blocked in open(2).
// The writer is released at the end, so the test ends either way.
class FifoWithWriter {
 public:
  explicit FifoWithWriter(std::string path) : path_(std::move(path)) {
    EXPECT_EQ(::mkfifo(path_.c_str(), 0600), 0);
    writer_ = std::thread([this] {
      const int fd = ::open(path_.c_str(), O_WRONLY);
      if (fd >= 0) ::close(fd);
    });
  }
  ~FifoWithWriter() {
    const int fd = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK);  // releases a waiting writer
    writer_.join();
    if (fd >= 0) ::close(fd);
  }

 private:
  std::string path_;
  std::thread writer_;
};

TEST_F(EnvReadersTest, FifoIsRefusedByNameByEveryReaderWithoutBeingOpened) {
  const std::string fifo = Path("log.fifo");
  FifoWithWriter writer(fifo);
  Env* env = Env::Default();
  std::string text;
  Status st = env->ReadFileToString(fifo, &text);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("'" + fifo + "' is a FIFO"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("write the data to a file first"), std::string::npos);
  std::unique_ptr<ReadOnlyRegion> region;
  st = env->MapReadOnly(fifo, &region);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("is a FIFO"), std::string::npos) << st.message();
  st = env->ReadFileRange(fifo, 0, 100, &text);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.ToString();
  FileType type = FileType::kRegular;
  ASSERT_TRUE(env->GetFileType(fifo, &type).ok());
  EXPECT_EQ(type, FileType::kFifo);
  // Through the fault-injecting Env the same.
  FaultInjectionEnv fenv(env);
  st = fenv.ReadFileToString(fifo, &text, 100);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.ToString();
}

TEST_F(EnvReadersTest, DevZeroIsRefusedAsADeviceInsteadOfFillingMemory) {
  Env* env = Env::Default();
  std::string text;
  const Status st = env->ReadFileToString("/dev/zero", &text);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("'/dev/zero' is a character device, not a regular file"),
            std::string::npos)
      << st.message();
  EXPECT_TRUE(text.empty());
  FileType type = FileType::kRegular;
  ASSERT_TRUE(env->GetFileType("/dev/zero", &type).ok());
  EXPECT_EQ(type, FileType::kCharDevice);
}

TEST_F(EnvReadersTest, AFileOverTheCapIsRefusedWithTheCapAndOneWithinItIsRead) {
  Env* env = Env::Default();
  const std::string big = Path("big.json");
  std::ofstream(big) << std::string(kMiB + 1, ' ');
  std::string text;
  Status st = env->ReadFileToString(big, &text, kMiB);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("'" + big + "' is larger than 1 MiB"), std::string::npos)
      << st.message();
  EXPECT_TRUE(text.empty());
  ASSERT_TRUE(env->ReadFileToString(big, &text, kMiB + 1).ok());
  EXPECT_EQ(text.size(), kMiB + 1);
  // /proc files say they are empty and are read up to the cap all the same.
  ASSERT_TRUE(env->ReadFileToString("/proc/self/status", &text).ok());
  EXPECT_NE(text.find("Name:"), std::string::npos);
  st = env->ReadFileToString("/proc/self/status", &text, 8);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("larger than 8 bytes"), std::string::npos) << st.message();
  EXPECT_EQ(FormatByteCap(16 * kMiB), "16 MiB");
  EXPECT_EQ(FormatByteCap(kDefaultReadCap), "1 GiB");
}

TEST_F(EnvReadersTest, SymlinkLoopIsNamedNotMistakenForAMissingFile) {
  Env* env = Env::Default();
  const std::string a = Path("a"), b = Path("b");
  fs::create_symlink(b, a);
  fs::create_symlink(a, b);
  EXPECT_FALSE(env->FileExists(a));  // what access(2) says: why the loop read as "not yet"
  FileType type = FileType::kRegular;
  Status st = env->GetFileType(a, &type);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("'" + a + "' is a symbolic link loop (ELOOP"), std::string::npos)
      << st.message();
  st = env->GetFileType(Path("missing"), &type);
  EXPECT_EQ(st.code(), Status::Code::kNotFound) << st.ToString();
  ASSERT_TRUE(env->GetFileType(dir_.string(), &type).ok());
  EXPECT_EQ(type, FileType::kDirectory);
}

}  // namespace
}  // namespace keel

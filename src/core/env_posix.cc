// The default Env: POSIX files, mmap, and the monotonic clock.
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>  // renameat2
#include <cstring>
#include <filesystem>
#include <thread>

#include "core/env.h"

namespace keel {
namespace {

Status PosixError(const std::string& what, const std::string& path, int err) {
  return Status::IOError(what + " '" + path + "': " + std::strerror(err));
}

class PosixWritableFile : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }
  Status Append(std::string_view data) override {
    const char* p = data.data();
    size_t left = data.size();
    while (left > 0) {
      ssize_t n = ::write(fd_, p, left);
      if (n < 0) {
        if (errno == EINTR) continue;
        return PosixError("cannot write", path_, errno);
      }
      p += n;
      left -= static_cast<size_t>(n);
    }
    return Status::OK();
  }
  Status Flush() override { return Status::OK(); }  // unbuffered: every Append is a write(2)
  Status Sync() override {
    if (::fsync(fd_) != 0) return PosixError("cannot fsync", path_, errno);
    return Status::OK();
  }
  Status Close() override {
    if (fd_ >= 0 && ::close(fd_) != 0) {
      fd_ = -1;
      return PosixError("cannot close", path_, errno);
    }
    fd_ = -1;
    return Status::OK();
  }

 private:
  std::string path_;
  int fd_;
};

class MmapRegion : public ReadOnlyRegion {
 public:
  MmapRegion(void* base, size_t size) : base_(base), size_(size) {}
  ~MmapRegion() override {
    if (base_ != nullptr && size_ > 0) ::munmap(base_, size_);
  }
  const char* data() const override { return static_cast<const char*>(base_); }
  size_t size() const override { return size_; }

 private:
  void* base_;
  size_t size_;
};

class PosixEnv : public Env {
 public:
  Status NewWritableFile(const std::string& path, std::unique_ptr<WritableFile>* out) override {
    return Open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, out);
  }
  Status NewAppendableFile(const std::string& path, std::unique_ptr<WritableFile>* out) override {
    return Open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, out);
  }
  Status ReadFileToString(const std::string& path, std::string* out) override {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return PosixError("cannot open", path, errno);
    out->clear();
    char buf[1 << 16];
    while (true) {
      ssize_t n = ::read(fd, buf, sizeof(buf));
      if (n < 0) {
        if (errno == EINTR) continue;
        int err = errno;
        ::close(fd);
        return PosixError("cannot read", path, err);
      }
      if (n == 0) break;
      out->append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
    return Status::OK();
  }
  Status MapReadOnly(const std::string& path, std::unique_ptr<ReadOnlyRegion>* out) override {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return PosixError("cannot open", path, errno);
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      int err = errno;
      ::close(fd);
      return PosixError("cannot stat", path, err);
    }
    size_t size = static_cast<size_t>(st.st_size);
    void* base = nullptr;
    if (size > 0) {
      base = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
      if (base == MAP_FAILED) {
        int err = errno;
        ::close(fd);
        return PosixError("cannot mmap", path, err);
      }
    }
    ::close(fd);
    *out = std::make_unique<MmapRegion>(base, size);
    return Status::OK();
  }
  bool FileExists(const std::string& path) override { return ::access(path.c_str(), F_OK) == 0; }
  bool IsDirectory(const std::string& path) override {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  }
  Status GetFileSize(const std::string& path, uint64_t* size) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return PosixError("cannot stat", path, errno);
    *size = static_cast<uint64_t>(st.st_size);
    return Status::OK();
  }
  Status GetChildren(const std::string& dir, std::vector<std::string>* names) override {
    names->clear();
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return PosixError("cannot list directory", dir, errno);
    while (struct dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") names->push_back(n);
    }
    ::closedir(d);
    return Status::OK();
  }
  Status CreateDirs(const std::string& dir) override {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return Status::IOError("cannot create directory '" + dir + "': " + ec.message());
    return Status::OK();
  }
  Status RenameFile(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0)
      return PosixError("cannot rename to '" + to + "'", from, errno);
    return Status::OK();
  }
  Status ExchangePaths(const std::string& a, const std::string& b) override {
    if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) != 0)
      return PosixError("cannot exchange with '" + b + "'", a, errno);
    return Status::OK();
  }
  Status LinkFile(const std::string& from, const std::string& to) override {
    if (::link(from.c_str(), to.c_str()) != 0)
      return PosixError("cannot link to '" + to + "'", from, errno);
    return Status::OK();
  }
  Status RemoveFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return PosixError("cannot remove", path, errno);
    return Status::OK();
  }
  Status RemoveDirRecursive(const std::string& dir) override {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    if (ec) return Status::IOError("cannot remove directory '" + dir + "': " + ec.message());
    return Status::OK();
  }
  Status SyncDir(const std::string& dir) override {
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return PosixError("cannot open directory", dir, errno);
    int rc = ::fsync(fd);
    int err = errno;
    ::close(fd);
    if (rc != 0) return PosixError("cannot fsync directory", dir, err);
    return Status::OK();
  }
  uint64_t NowMicros() override {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                     std::chrono::steady_clock::now().time_since_epoch())
                                     .count());
  }
  void SleepForMicros(uint64_t micros) override {
    std::this_thread::sleep_for(std::chrono::microseconds(micros));
  }

 private:
  Status Open(const std::string& path, int flags, std::unique_ptr<WritableFile>* out) {
    int fd = ::open(path.c_str(), flags, 0644);
    if (fd < 0) return PosixError("cannot open for writing", path, errno);
    *out = std::make_unique<PosixWritableFile>(path, fd);
    return Status::OK();
  }
};

}  // namespace

Env* Env::Default() {
  static PosixEnv env;
  return &env;
}

std::string JoinPath(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (a.back() == '/') return a + b;
  return a + "/" + b;
}

Status WriteFileAtomic(Env* env, const std::string& path, std::string_view data) {
  std::string dir = ".";
  auto slash = path.rfind('/');
  if (slash != std::string::npos) dir = slash == 0 ? "/" : path.substr(0, slash);
  const std::string tmp = path + ".tmp";
  std::unique_ptr<WritableFile> f;
  KEEL_RETURN_IF_ERROR(env->NewWritableFile(tmp, &f));
  Status st = f->Append(data);
  if (st.ok()) st = f->Sync();
  Status cst = f->Close();
  if (st.ok()) st = cst;
  if (st.ok()) st = env->RenameFile(tmp, path);
  if (!st.ok()) {
    env->RemoveFile(tmp);  // best effort: the old file is untouched
    return st;
  }
  return env->SyncDir(dir);
}

}  // namespace keel

// The default Env: POSIX files, mmap, and the monotonic clock.
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>  // renameat2
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>

#include "core/env.h"

namespace keel {
namespace {

Status PosixError(const std::string& what, const std::string& path, int err) {
  return Status::IOError(what + " '" + path + "': " + std::strerror(err));
}

// Small writes go straight to write(2). A file opened with `direct_ok` (NewWritableFile: written
// from offset 0) that receives an Append of at least kDirectMin bytes switches to O_DIRECT: the
// data is copied through an aligned bounce buffer and written in kBounce blocks that bypass the
// page cache, which on the development VM writes a checkpoint 2-3x faster than buffered writes
// plus fsync. Until Flush, Sync or Close, up to kBounce bytes then wait in the buffer; Flush writes
// them (the unaligned tail without O_DIRECT) and returns to plain writes. Where the file system
// refuses O_DIRECT the file simply stays buffered.
class PosixWritableFile : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd, bool direct_ok)
      : path_(std::move(path)), fd_(fd), direct_ok_(direct_ok) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) {
      (void)FlushBounce();
      ::close(fd_);
    }
    std::free(bounce_);
  }
  Status Append(std::string_view data) override {
    if (!direct_ && direct_ok_ && data.size() >= kDirectMin) {
      // Reach an aligned offset with a plain write, then turn O_DIRECT on.
      const size_t pad = (kAlign - offset_ % kAlign) % kAlign;
      KEEL_RETURN_IF_ERROR(WriteAll(data.data(), pad));
      data.remove_prefix(pad);
      direct_ = StartDirect();
    }
    if (!direct_) return WriteAll(data.data(), data.size());
    while (!data.empty()) {
      const size_t k = std::min(data.size(), kBounce - filled_);
      std::memcpy(bounce_ + filled_, data.data(), k);
      filled_ += k;
      data.remove_prefix(k);
      if (filled_ == kBounce) {
        KEEL_RETURN_IF_ERROR(WriteAll(bounce_, kBounce));
        filled_ = 0;
      }
    }
    return Status::OK();
  }
  Status Flush() override { return FlushBounce(); }
  Status Sync() override {
    KEEL_RETURN_IF_ERROR(FlushBounce());
    if (::fsync(fd_) != 0) return PosixError("cannot fsync", path_, errno);
    return Status::OK();
  }
  Status Close() override {
    Status st = FlushBounce();
    if (fd_ >= 0 && ::close(fd_) != 0 && st.ok()) st = PosixError("cannot close", path_, errno);
    fd_ = -1;
    return st;
  }

 private:
  static constexpr size_t kAlign = 4096;
  static constexpr size_t kBounce = size_t{16} << 20;
  static constexpr size_t kDirectMin = size_t{4} << 20;

  bool StartDirect() {
    if (bounce_ == nullptr) bounce_ = static_cast<char*>(std::aligned_alloc(kAlign, kBounce));
    const int flags = ::fcntl(fd_, F_GETFL);
    if (bounce_ == nullptr || flags < 0 || ::fcntl(fd_, F_SETFL, flags | O_DIRECT) != 0) {
      direct_ok_ = false;  // not supported here: stay buffered
      return false;
    }
    return true;
  }
  // Leaves O_DIRECT mode, writing what waits in the bounce buffer: its aligned part directly, the
  // rest through the page cache.
  Status FlushBounce() {
    if (!direct_) return Status::OK();
    const size_t aligned = filled_ / kAlign * kAlign;
    Status st = WriteAll(bounce_, aligned);
    const int flags = ::fcntl(fd_, F_GETFL);
    if (flags >= 0) ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT);
    direct_ = false;
    if (st.ok()) st = WriteAll(bounce_ + aligned, filled_ - aligned);
    filled_ = 0;
    return st;
  }
  Status WriteAll(const char* p, size_t left) {
    while (left > 0) {
      ssize_t n = ::write(fd_, p, left);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EINVAL && direct_) {
          // The file system refused this O_DIRECT write: carry on through the page cache.
          const int flags = ::fcntl(fd_, F_GETFL);
          if (flags >= 0 && ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT) == 0) {
            direct_ok_ = false;
            continue;
          }
        }
        return PosixError("cannot write", path_, errno);
      }
      p += n;
      left -= static_cast<size_t>(n);
      offset_ += static_cast<uint64_t>(n);
    }
    return Status::OK();
  }

  std::string path_;
  int fd_;
  bool direct_ok_;
  bool direct_ = false;  // O_DIRECT is on and appends go through bounce_
  char* bounce_ = nullptr;
  size_t filled_ = 0;
  uint64_t offset_ = 0;  // bytes written so far (the file offset: the file was empty)
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

// Emptied on release, so the next holder can tell a clean release from a holder that died.
class PosixFileLock : public FileLock {
 public:
  explicit PosixFileLock(int fd) : fd_(fd) {}
  ~PosixFileLock() override {
    (void)::ftruncate(fd_, 0);
    ::close(fd_);  // releases the flock
  }

 private:
  int fd_;
};

class PosixEnv : public Env {
 public:
  Status NewWritableFile(const std::string& path, std::unique_ptr<WritableFile>* out) override {
    return Open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, out);
  }
  Status NewAppendableFile(const std::string& path, std::unique_ptr<WritableFile>* out) override {
    return Open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, out);
  }
  Status ReadFileToString(const std::string& path, std::string* out, uint64_t max_bytes) override {
    out->clear();
    int fd = -1;
    struct stat st;
    KEEL_RETURN_IF_ERROR(OpenRegular(path, &fd, &st));
    if (static_cast<uint64_t>(st.st_size) > max_bytes) {
      ::close(fd);
      return FileTooLarge(path, max_bytes);
    }
    char buf[1 << 16];
    while (true) {
      ssize_t n = ::read(fd, buf, sizeof(buf));
      if (n < 0) {
        if (errno == EINTR) continue;
        int err = errno;
        ::close(fd);
        out->clear();
        return PosixError("cannot read", path, err);
      }
      if (n == 0) break;
      if (out->size() + static_cast<size_t>(n) > max_bytes) {  // grew while read, or /proc
        ::close(fd);
        out->clear();
        return FileTooLarge(path, max_bytes);
      }
      out->append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
    return Status::OK();
  }
  Status ReadFileRange(const std::string& path, uint64_t offset, size_t n,
                       std::string* out) override {
    int fd = -1;
    struct stat st;
    KEEL_RETURN_IF_ERROR(OpenRegular(path, &fd, &st));
    out->resize(n);
    size_t got = 0;
    while (got < n) {
      const ssize_t r = ::pread(fd, out->data() + got, n - got, static_cast<off_t>(offset + got));
      if (r < 0) {
        if (errno == EINTR) continue;
        const int err = errno;
        ::close(fd);
        out->clear();
        return PosixError("cannot read", path, err);
      }
      if (r == 0) break;
      got += static_cast<size_t>(r);
    }
    ::close(fd);
    out->resize(got);
    return Status::OK();
  }
  Status MapReadOnly(const std::string& path, std::unique_ptr<ReadOnlyRegion>* out) override {
    int fd = -1;
    struct stat st;
    KEEL_RETURN_IF_ERROR(OpenRegular(path, &fd, &st, "map"));
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
  Status GetFileType(const std::string& path, FileType* type) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      const int err = errno;
      if (err == ENOENT || err == ENOTDIR) return Status::NotFound("no such file '" + path + "'");
      if (err == ELOOP)
        return Status::InvalidArgument(
            "'" + path + "' is a symbolic link loop (ELOOP: " + std::strerror(err) +
            "): a link in it points, directly or through others, back at itself; point it at "
            "the file");
      return PosixError("cannot stat", path, err);
    }
    *type = TypeOf(st.st_mode);
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
  Status LockFile(const std::string& path, const std::string& me, std::unique_ptr<FileLock>* lock,
                  std::string* previous) override {
    lock->reset();
    previous->clear();
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return PosixError("cannot open the lock file", path, errno);
    const bool held_elsewhere = ::flock(fd, LOCK_EX | LOCK_NB) != 0;
    const int lock_err = errno;
    char buf[4096];  // a holder's description is one short line
    const ssize_t n = ::pread(fd, buf, sizeof(buf), 0);
    if (n > 0) previous->assign(buf, static_cast<size_t>(n));
    if (held_elsewhere) {
      ::close(fd);
      if (lock_err == EWOULDBLOCK) return Status::OK();
      return PosixError("cannot lock", path, lock_err);
    }
    if (::ftruncate(fd, 0) != 0 ||
        ::pwrite(fd, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
      const int err = errno;
      ::close(fd);
      return PosixError("cannot write the lock file", path, err);
    }
    (void)::fsync(fd);
    *lock = std::make_unique<PosixFileLock>(fd);
    return Status::OK();
  }

 private:
  static FileType TypeOf(mode_t mode) {
    if (S_ISREG(mode)) return FileType::kRegular;
    if (S_ISDIR(mode)) return FileType::kDirectory;
    if (S_ISFIFO(mode)) return FileType::kFifo;
    if (S_ISCHR(mode)) return FileType::kCharDevice;
    if (S_ISBLK(mode)) return FileType::kBlockDevice;
    if (S_ISSOCK(mode)) return FileType::kSocket;
    return FileType::kOther;
  }
  // Opens `path` for reading only if it is a regular file. It is stat'ed first, so a device is
  // never opened (an open can have effects, or block: a FIFO with no writer blocks open(2) for
  // good, deaf to SIGINT); the open is non-blocking and re-checked with fstat, so a FIFO put
  // there in between is refused too.
  static Status OpenRegular(const std::string& path, int* fd, struct stat* st,
                            const char* verb = "read") {
    auto refuse = [&](mode_t mode) {
      if (S_ISDIR(mode))
        return Status::IOError(std::string("cannot ") + verb + " '" + path +
                               "': it is a directory, not a file");
      return NotRegularFile(path, TypeOf(mode));
    };
    if (::stat(path.c_str(), st) != 0) return PosixError("cannot open", path, errno);
    if (!S_ISREG(st->st_mode)) return refuse(st->st_mode);
    const int f = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (f < 0) return PosixError("cannot open", path, errno);
    if (::fstat(f, st) != 0) {
      const int err = errno;
      ::close(f);
      return PosixError("cannot stat", path, err);
    }
    if (!S_ISREG(st->st_mode)) {
      ::close(f);
      return refuse(st->st_mode);
    }
    *fd = f;
    return Status::OK();
  }
  Status Open(const std::string& path, int flags, std::unique_ptr<WritableFile>* out) {
    int fd = ::open(path.c_str(), flags, 0644);
    if (fd < 0) return PosixError("cannot open for writing", path, errno);
    *out = std::make_unique<PosixWritableFile>(path, fd, (flags & O_APPEND) == 0);
    return Status::OK();
  }
};

}  // namespace

Env* Env::Default() {
  static PosixEnv env;
  return &env;
}

Status Env::ReadFileRange(const std::string& path, uint64_t offset, size_t n, std::string* out) {
  std::unique_ptr<ReadOnlyRegion> region;
  KEEL_RETURN_IF_ERROR(MapReadOnly(path, &region));
  out->clear();
  if (offset < region->size())
    out->assign(region->data() + offset, std::min<uint64_t>(n, region->size() - offset));
  return Status::OK();
}

Status Env::GetFileType(const std::string& path, FileType* type) {
  if (IsDirectory(path)) {
    *type = FileType::kDirectory;
  } else if (FileExists(path)) {
    *type = FileType::kRegular;
  } else {
    return Status::NotFound("no such file '" + path + "'");
  }
  return Status::OK();
}

const char* DescribeFileType(FileType type) {
  switch (type) {
    case FileType::kRegular:
      return "a regular file";
    case FileType::kDirectory:
      return "a directory";
    case FileType::kFifo:
      return "a FIFO (a named pipe, or a shell's <(...))";
    case FileType::kCharDevice:
      return "a character device";
    case FileType::kBlockDevice:
      return "a block device";
    case FileType::kSocket:
      return "a socket";
    case FileType::kOther:
      break;
  }
  return "not a regular file";
}

std::string FormatByteCap(uint64_t bytes) {
  if (bytes >= (uint64_t{1} << 30) && bytes % (uint64_t{1} << 30) == 0)
    return std::to_string(bytes >> 30) + " GiB";
  if (bytes >= kMiB && bytes % kMiB == 0) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes) + " bytes";
}

Status NotRegularFile(const std::string& path, FileType type) {
  return Status::InvalidArgument(
      "'" + path + "' is " + DescribeFileType(type) +
      ", not a regular file: keel reads only regular files here (a pipe or device would block "
      "it or never end); write the data to a file first and pass that file");
}

Status FileTooLarge(const std::string& path, uint64_t max_bytes) {
  return Status::InvalidArgument("'" + path + "' is larger than " + FormatByteCap(max_bytes) +
                                 ", the most keel reads of such a file: is it the right file?");
}

double Env::ProcessCpuSeconds() {
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) != 0) return NAN;
  auto secs = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec);
  };
  return secs(u.ru_utime) + secs(u.ru_stime);
}

int64_t Env::NowUnixMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

namespace {

// The number that `text` holds (surrounding whitespace allowed), if any.
std::optional<uint64_t> ParseCount(const std::string& text) {
  size_t i = text.find_first_not_of(" \t\n");
  if (i == std::string::npos || !std::isdigit(static_cast<unsigned char>(text[i])))
    return std::nullopt;
  uint64_t v = 0;
  for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i) {
    if (v > (UINT64_MAX - 9) / 10) return std::nullopt;
    v = v * 10 + static_cast<uint64_t>(text[i] - '0');
  }
  return v;
}

// The value of the line "KEY VALUE" (or "KEY: VALUE") of a /proc- or cgroup-style file.
std::optional<uint64_t> KeyedCount(const std::string& text, const std::string& key) {
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(at, end - at);
    if (line.compare(0, key.size(), key) == 0 && line.size() > key.size() &&
        (line[key.size()] == ' ' || line[key.size()] == ':'))
      return ParseCount(line.substr(key.size() + 1));
    at = end + 1;
  }
  return std::nullopt;
}

}  // namespace

Status AvailableMemoryFromFiles(const ReadTextFn& read, MemoryAvailable* out) {
  std::optional<uint64_t> best;
  std::string text;
  if (read("/proc/meminfo", &text)) {
    if (std::optional<uint64_t> kb = KeyedCount(text, "MemAvailable")) {
      best = *kb * 1024;
      out->source = "MemAvailable in /proc/meminfo";
    }
  }
  // The cgroup's limit, and every ancestor's: what it leaves is the limit less what the group
  // uses, page cache it can drop (inactive files) not counted as used.
  std::string groups;
  if (read("/proc/self/cgroup", &groups)) {
    size_t at = 0;
    while (at < groups.size()) {
      size_t end = groups.find('\n', at);
      if (end == std::string::npos) end = groups.size();
      const std::string line = groups.substr(at, end - at);
      at = end + 1;
      const size_t c1 = line.find(':'), c2 = line.find(':', c1 + 1);
      if (c1 == std::string::npos || c2 == std::string::npos) continue;
      const std::string id = line.substr(0, c1), controllers = line.substr(c1 + 1, c2 - c1 - 1);
      std::string path = line.substr(c2 + 1);
      const bool v2 = id == "0" && controllers.empty();
      const bool v1 = ("," + controllers + ",").find(",memory,") != std::string::npos;
      if (!v2 && !v1) continue;
      const std::string base = v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory";
      const char* limit_file = v2 ? "memory.max" : "memory.limit_in_bytes";
      const char* usage_file = v2 ? "memory.current" : "memory.usage_in_bytes";
      while (true) {
        const std::string dir = path == "/" || path.empty() ? base : base + path;
        std::string limit_text, usage_text, stat_text;
        if (read(dir + "/" + limit_file, &limit_text) &&
            read(dir + "/" + usage_file, &usage_text)) {
          const std::optional<uint64_t> limit = ParseCount(limit_text);  // "max": none
          const std::optional<uint64_t> usage = ParseCount(usage_text);
          if (limit && usage && *limit < (uint64_t{1} << 60)) {
            uint64_t used = *usage;
            if (read(dir + "/memory.stat", &stat_text)) {
              const std::optional<uint64_t> inactive =
                  KeyedCount(stat_text, v2 ? "inactive_file" : "total_inactive_file");
              if (inactive) used -= std::min(used, *inactive);
            }
            const uint64_t left = *limit > used ? *limit - used : 0;
            if (!best || left < *best) {
              best = left;
              out->source = "the memory limit of " + dir + "/" + limit_file + ", less what the " +
                            "cgroup uses";
            }
          }
        }
        if (path == "/" || path.empty()) break;
        const size_t slash = path.rfind('/');
        path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
      }
    }
  }
  if (!best) return Status::NotFound("the available memory is unknown (no /proc/meminfo)");
  out->bytes = *best;
  return Status::OK();
}

Status Env::AvailableMemory(MemoryAvailable* out) {
  return AvailableMemoryFromFiles(
      [this](const std::string& path, std::string* text) {
        return ReadFileToString(path, text).ok();
      },
      out);
}

std::string AssetsDir() {
  const char* v = std::getenv("KEEL_ASSETS_DIR");
  return v != nullptr && v[0] != '\0' ? v : KEEL_ASSETS_DIR;
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

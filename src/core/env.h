// Env: the seam through which keel touches the filesystem and the clock (LevelDB style). Production
// code uses Env::Default(); tests substitute an Env that injects short writes, ENOSPC, failed fsync
// or rename, and a fake clock, so crashes and hangs are tested rather than hoped for.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace keel {

class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual Status Append(std::string_view data) = 0;
  virtual Status Flush() = 0;
  virtual Status Sync() = 0;  // fsync: data is durable once this returns OK
  virtual Status Close() = 0;
};

// A read-only view of a whole file (mmap in the default Env).
class ReadOnlyRegion {
 public:
  virtual ~ReadOnlyRegion() = default;
  virtual const char* data() const = 0;
  virtual size_t size() const = 0;
};

// An advisory lock on a file (flock), held until this object goes. The kernel drops it when its
// process ends, however it ends, so a lock never outlives a crashed holder.
class FileLock {
 public:
  virtual ~FileLock() = default;
};

// What a path is (stat(2), following symbolic links).
enum class FileType { kRegular, kDirectory, kFifo, kCharDevice, kBlockDevice, kSocket, kOther };

// "a FIFO (named pipe)", "a character device", ...: for messages.
const char* DescribeFileType(FileType type);

inline constexpr uint64_t kMiB = uint64_t{1} << 20;
// The most a whole-file read takes into memory when its caller names no cap of its own (each
// reader of outside input names a smaller one: docs/config.md lists them).
inline constexpr uint64_t kDefaultReadCap = uint64_t{1} << 30;

// "16 MiB", "1 GiB", "512 bytes": a cap as messages state it.
std::string FormatByteCap(uint64_t bytes);

// InvalidArgument: `path` is a FIFO, device or socket where a regular file is expected, and what
// to pass instead. keel never opens such a file for reading: it would block (a FIFO with no
// writer) or never end (/dev/zero).
Status NotRegularFile(const std::string& path, FileType type);
// InvalidArgument: `path` holds more than `max_bytes`, the cap of this read.
Status FileTooLarge(const std::string& path, uint64_t max_bytes);

// Memory this process can still allocate, and where that figure comes from.
struct MemoryAvailable {
  uint64_t bytes = 0;
  std::string source;  // e.g. "MemAvailable in /proc/meminfo"
};

class Env {
 public:
  virtual ~Env() = default;
  static Env* Default();

  virtual Status NewWritableFile(const std::string& path, std::unique_ptr<WritableFile>* out) = 0;
  virtual Status NewAppendableFile(const std::string& path, std::unique_ptr<WritableFile>* out) = 0;
  // The whole of `path`, at most `max_bytes` of it. Only a regular file is read: a FIFO, device
  // or socket is refused by name (NotRegularFile) without blocking on it, and a longer file with
  // the cap in the message (FileTooLarge), having taken no more than the cap into memory. (/proc
  // files are regular: their size reads 0, their content is read up to the cap.)
  virtual Status ReadFileToString(const std::string& path, std::string* out,
                                  uint64_t max_bytes) = 0;
  Status ReadFileToString(const std::string& path, std::string* out) {
    return ReadFileToString(path, out, kDefaultReadCap);
  }
  // Regular files only, as ReadFileToString.
  virtual Status MapReadOnly(const std::string& path, std::unique_ptr<ReadOnlyRegion>* out) = 0;
  // Up to `n` bytes of `path` from byte `offset`, as the file is now (fewer at its end, none past
  // it): for a file another process appends to or truncates (a log being followed, an input read
  // in pieces), where a mapping would fault (SIGBUS) on pages cut off under it. Regular files
  // only, as ReadFileToString. The default copies them out of MapReadOnly.
  virtual Status ReadFileRange(const std::string& path, uint64_t offset, size_t n,
                               std::string* out);
  virtual bool FileExists(const std::string& path) = 0;
  virtual bool IsDirectory(const std::string& path) = 0;
  virtual Status GetFileSize(const std::string& path, uint64_t* size) = 0;
  // What `path` is, without opening it. NotFound when nothing is there; InvalidArgument naming a
  // symbolic link loop (ELOOP), which FileExists cannot tell from a missing file. The default
  // knows regular files and directories only (FileExists, IsDirectory).
  virtual Status GetFileType(const std::string& path, FileType* type);
  virtual Status GetChildren(const std::string& dir, std::vector<std::string>* names) = 0;
  virtual Status CreateDirs(const std::string& dir) = 0;  // mkdir -p
  virtual Status RenameFile(const std::string& from, const std::string& to) = 0;
  // Swaps two existing paths in one atomic step (renameat2 RENAME_EXCHANGE): used to replace a
  // whole directory (an edited checkpoint) so readers see the old or the new one, never neither.
  virtual Status ExchangePaths(const std::string& a, const std::string& b) = 0;
  // A second name for an existing file (link(2)): an edited checkpoint shares its unchanged files.
  virtual Status LinkFile(const std::string& from, const std::string& to) = 0;
  virtual Status RemoveFile(const std::string& path) = 0;
  virtual Status RemoveDirRecursive(const std::string& dir) = 0;
  virtual Status SyncDir(const std::string& dir) = 0;  // fsync a directory after a rename

  virtual uint64_t NowMicros() = 0;  // monotonic
  // Wall-clock time in microseconds since the Unix epoch, for names and stamps people read
  // (archive directories); durations use NowMicros. Tests fix it to force name collisions.
  virtual int64_t NowUnixMicros();
  virtual void SleepForMicros(uint64_t micros) = 0;
  // The process's CPU seconds so far (user and system, every thread; NaN where not known): set
  // against NowMicros, it tells another process on the cores from the process's own work.
  virtual double ProcessCpuSeconds();

  // Memory this process can still allocate: MemAvailable of /proc/meminfo, or what the limit of
  // its cgroup (memory.max; memory.limit_in_bytes in cgroup v1) leaves when that is less. NotFound
  // where neither can be read. Tests substitute a figure.
  virtual Status AvailableMemory(MemoryAvailable* out);

  // Takes an exclusive advisory lock on `path` (created if missing) without waiting. `*previous`
  // gets what the file held: the holder's description when another process holds the lock (then
  // `*lock` is null and the status OK), else what a holder that ended without releasing left
  // (empty after a clean release). Once taken, the file holds `me` until the lock is released,
  // when it is emptied.
  virtual Status LockFile(const std::string& path, const std::string& me,
                          std::unique_ptr<FileLock>* lock, std::string* previous) = 0;
};

// AvailableMemory computed from the files it reads through `read` (false: unreadable).
using ReadTextFn = std::function<bool(const std::string& path, std::string* text)>;
Status AvailableMemoryFromFiles(const ReadTextFn& read, MemoryAvailable* out);

// Writes `data` to `path` atomically: temp file in the same directory, fsync, rename, fsync dir.
// Either the old content or the new content is visible afterwards, never a mix.
Status WriteFileAtomic(Env* env, const std::string& path, std::string_view data);

// Where set-up installed the npm assets (corpora, GPT-2 BPE files, uPlot): $KEEL_ASSETS_DIR if set
// and not empty, else the directory this build was configured with.
std::string AssetsDir();

// Joins path components with exactly one '/'.
std::string JoinPath(const std::string& a, const std::string& b);

}  // namespace keel

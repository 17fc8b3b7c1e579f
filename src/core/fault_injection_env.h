// FaultInjectionEnv: an Env that forwards to another one and injects the failures durable state
// must survive: a write that fills the disk half-way (ENOSPC), a failed fsync, a failed rename, and
// a crash (the process dies between two filesystem operations). Tests use it in-process; the CLI
// arms it from KEEL_FAULT_INJECTION so kill points inside a save are reached deterministically.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "core/env.h"

namespace keel {

class FaultInjectionEnv : public Env {
 public:
  enum class Fault {
    kNoSpace,      // an Append writes half its bytes, then fails with ENOSPC
    kSyncFails,    // a file or directory fsync fails (EIO)
    kRenameFails,  // a rename or exchange fails (EIO)
    kCrash,        // the crash hook runs before the operation (default: the process is killed)
  };

  explicit FaultInjectionEnv(Env* base);
  ~FaultInjectionEnv() override;

  // Arms `fault` at the nth (1-based) operation it applies to whose path contains `path_part`:
  // appends for kNoSpace, syncs for kSyncFails, renames for kRenameFails, any filesystem mutation
  // (create, append, sync, rename, remove, mkdir) for kCrash. One fault is armed at a time. With
  // `persistent` every matching operation from the nth on fails (a disk that stays full).
  void Arm(Fault fault, int64_t nth, std::string path_part = "", bool persistent = false);
  // What a crash does. The default sends SIGKILL to this process. In-process tests install a hook
  // that returns; the Env is then dead: every later operation fails without touching the disk,
  // which leaves the files exactly as a killed process would.
  void SetCrashHook(std::function<void()> hook);
  bool crashed() const { return dead_; }
  bool fired() const { return fired_; }
  // Filesystem mutations seen so far (to enumerate crash points).
  int64_t mutations() const { return mutations_; }

  // Parses "crash-at=N[:PATH_PART]", "enospc-at=N[:PATH_PART]", "fail-sync-at=N[:PATH_PART]" or
  // "fail-rename-at=N[:PATH_PART]" (the KEEL_FAULT_INJECTION syntax).
  static Status FromSpec(const std::string& spec, Env* base,
                         std::unique_ptr<FaultInjectionEnv>* out);

  Status NewWritableFile(const std::string& path, std::unique_ptr<WritableFile>* out) override;
  Status NewAppendableFile(const std::string& path, std::unique_ptr<WritableFile>* out) override;
  using Env::ReadFileToString;
  Status ReadFileToString(const std::string& path, std::string* out, uint64_t max_bytes) override;
  Status MapReadOnly(const std::string& path, std::unique_ptr<ReadOnlyRegion>* out) override;
  Status ReadFileRange(const std::string& path, uint64_t offset, size_t n,
                       std::string* out) override;
  bool FileExists(const std::string& path) override;
  bool IsDirectory(const std::string& path) override;
  Status GetFileSize(const std::string& path, uint64_t* size) override;
  Status GetFileType(const std::string& path, FileType* type) override;
  Status GetChildren(const std::string& dir, std::vector<std::string>* names) override;
  Status CreateDirs(const std::string& dir) override;
  Status RenameFile(const std::string& from, const std::string& to) override;
  Status ExchangePaths(const std::string& a, const std::string& b) override;
  Status LinkFile(const std::string& from, const std::string& to) override;
  Status RemoveFile(const std::string& path) override;
  Status RemoveDirRecursive(const std::string& dir) override;
  Status SyncDir(const std::string& dir) override;
  uint64_t NowMicros() override { return base_->NowMicros(); }
  int64_t NowUnixMicros() override { return base_->NowUnixMicros(); }
  double ProcessCpuSeconds() override { return base_->ProcessCpuSeconds(); }
  void SleepForMicros(uint64_t micros) override { base_->SleepForMicros(micros); }
  Status AvailableMemory(MemoryAvailable* out) override { return base_->AvailableMemory(out); }
  Status LockFile(const std::string& path, const std::string& me, std::unique_ptr<FileLock>* lock,
                  std::string* previous) override {
    return base_->LockFile(path, me, lock, previous);
  }

 private:
  friend class FaultInjectionFile;
  enum class Op { kCreate, kAppend, kSync, kRename, kRemove, kMkdir };
  // Counts the operation and decides whether it fails; returns the injected error, if any.
  Status Before(Op op, const std::string& path);

  Env* base_;
  std::function<void()> crash_hook_;
  // Before() runs on every thread that writes (an --async-save writer beside the loop).
  std::mutex mu_;
  bool armed_ = false, persistent_ = false;
  std::atomic<bool> fired_{false}, dead_{false};
  Fault fault_ = Fault::kCrash;
  int64_t nth_ = 0, seen_ = 0;
  std::string path_part_;
  std::atomic<int64_t> mutations_{0};
};

}  // namespace keel

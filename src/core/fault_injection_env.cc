#include "core/fault_injection_env.h"

#include <signal.h>
#include <unistd.h>

#include <charconv>

namespace keel {

namespace {
Status Dead(const std::string& path) {
  return Status::IOError("simulated crash: no filesystem access after the crash ('" + path + "')");
}
}  // namespace

class FaultInjectionFile : public WritableFile {
 public:
  FaultInjectionFile(FaultInjectionEnv* env, std::string path, std::unique_ptr<WritableFile> base)
      : env_(env), path_(std::move(path)), base_(std::move(base)) {}
  Status Append(std::string_view data) override {
    Status st = env_->Before(FaultInjectionEnv::Op::kAppend, path_);
    if (!st.ok()) {
      // A full disk: part of the data reaches the file before the write fails.
      if (!env_->dead_ && env_->fault_ == FaultInjectionEnv::Fault::kNoSpace)
        base_->Append(data.substr(0, data.size() / 2));
      return st;
    }
    return base_->Append(data);
  }
  Status Flush() override { return env_->dead_ ? Dead(path_) : base_->Flush(); }
  Status Sync() override {
    KEEL_RETURN_IF_ERROR(env_->Before(FaultInjectionEnv::Op::kSync, path_));
    return base_->Sync();
  }
  Status Close() override {
    if (env_->dead_) return Dead(path_);
    return base_->Close();
  }

 private:
  FaultInjectionEnv* env_;
  std::string path_;
  std::unique_ptr<WritableFile> base_;
};

FaultInjectionEnv::FaultInjectionEnv(Env* base) : base_(base) {
  crash_hook_ = [] {
    ::kill(::getpid(), SIGKILL);
    ::pause();
  };
}
FaultInjectionEnv::~FaultInjectionEnv() = default;

void FaultInjectionEnv::Arm(Fault fault, int64_t nth, std::string path_part, bool persistent) {
  std::lock_guard<std::mutex> lock(mu_);
  armed_ = true;
  persistent_ = persistent;
  fired_ = false;
  fault_ = fault;
  nth_ = nth;
  seen_ = 0;
  path_part_ = std::move(path_part);
}

void FaultInjectionEnv::SetCrashHook(std::function<void()> hook) {
  crash_hook_ = std::move(hook);
}

Status FaultInjectionEnv::Before(Op op, const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  if (dead_) return Dead(path);
  ++mutations_;
  if (!armed_ || (fired_ && !persistent_)) return Status::OK();
  bool applies = false;
  switch (fault_) {
    case Fault::kNoSpace:
      applies = op == Op::kAppend;
      break;
    case Fault::kSyncFails:
      applies = op == Op::kSync;
      break;
    case Fault::kRenameFails:
      applies = op == Op::kRename;
      break;
    case Fault::kCrash:
      applies = true;
      break;
  }
  if (!applies || path.find(path_part_) == std::string::npos) return Status::OK();
  if (++seen_ < nth_) return Status::OK();
  fired_ = true;
  switch (fault_) {
    case Fault::kNoSpace:
      return Status::IOError("cannot write '" + path + "': No space left on device (injected)");
    case Fault::kSyncFails:
      return Status::IOError("cannot fsync '" + path + "': Input/output error (injected)");
    case Fault::kRenameFails:
      return Status::IOError("cannot rename '" + path + "': Input/output error (injected)");
    case Fault::kCrash:
      dead_ = true;
      crash_hook_();
      return Dead(path);
  }
  return Status::OK();
}

Status FaultInjectionEnv::FromSpec(const std::string& spec, Env* base,
                                   std::unique_ptr<FaultInjectionEnv>* out) {
  const auto eq = spec.find('=');
  const std::string kind = spec.substr(0, eq);
  Fault f;
  if (kind == "crash-at") {
    f = Fault::kCrash;
  } else if (kind == "enospc-at") {
    f = Fault::kNoSpace;
  } else if (kind == "fail-sync-at") {
    f = Fault::kSyncFails;
  } else if (kind == "fail-rename-at") {
    f = Fault::kRenameFails;
  } else {
    return Status::InvalidArgument(
        "KEEL_FAULT_INJECTION='" + spec +
        "': expected crash-at=N, enospc-at=N, fail-sync-at=N or fail-rename-at=N (optionally "
        ":PATH_PART)");
  }
  std::string rest = eq == std::string::npos ? "" : spec.substr(eq + 1);
  const auto colon = rest.find(':');
  const std::string num = rest.substr(0, colon);
  int64_t n = 0;
  auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), n);
  if (ec != std::errc() || p != num.data() + num.size() || n < 1)
    return Status::InvalidArgument("KEEL_FAULT_INJECTION='" + spec +
                                   "': N must be a positive integer");
  *out = std::make_unique<FaultInjectionEnv>(base);
  (*out)->Arm(f, n, colon == std::string::npos ? "" : rest.substr(colon + 1));
  return Status::OK();
}

Status FaultInjectionEnv::NewWritableFile(const std::string& path,
                                          std::unique_ptr<WritableFile>* out) {
  KEEL_RETURN_IF_ERROR(Before(Op::kCreate, path));
  std::unique_ptr<WritableFile> f;
  KEEL_RETURN_IF_ERROR(base_->NewWritableFile(path, &f));
  *out = std::make_unique<FaultInjectionFile>(this, path, std::move(f));
  return Status::OK();
}
Status FaultInjectionEnv::NewAppendableFile(const std::string& path,
                                            std::unique_ptr<WritableFile>* out) {
  KEEL_RETURN_IF_ERROR(Before(Op::kCreate, path));
  std::unique_ptr<WritableFile> f;
  KEEL_RETURN_IF_ERROR(base_->NewAppendableFile(path, &f));
  *out = std::make_unique<FaultInjectionFile>(this, path, std::move(f));
  return Status::OK();
}
Status FaultInjectionEnv::ReadFileToString(const std::string& path, std::string* out,
                                           uint64_t max_bytes) {
  if (dead_) return Dead(path);
  return base_->ReadFileToString(path, out, max_bytes);
}
Status FaultInjectionEnv::MapReadOnly(const std::string& path,
                                      std::unique_ptr<ReadOnlyRegion>* out) {
  if (dead_) return Dead(path);
  return base_->MapReadOnly(path, out);
}
Status FaultInjectionEnv::ReadFileRange(const std::string& path, uint64_t offset, size_t n,
                                        std::string* out) {
  if (dead_) return Dead(path);
  return base_->ReadFileRange(path, offset, n, out);
}
bool FaultInjectionEnv::FileExists(const std::string& path) {
  return !dead_ && base_->FileExists(path);
}
bool FaultInjectionEnv::IsDirectory(const std::string& path) {
  return !dead_ && base_->IsDirectory(path);
}
Status FaultInjectionEnv::GetFileSize(const std::string& path, uint64_t* size) {
  if (dead_) return Dead(path);
  return base_->GetFileSize(path, size);
}
Status FaultInjectionEnv::GetFileType(const std::string& path, FileType* type) {
  if (dead_) return Dead(path);
  return base_->GetFileType(path, type);
}
Status FaultInjectionEnv::GetChildren(const std::string& dir, std::vector<std::string>* names) {
  if (dead_) return Dead(dir);
  return base_->GetChildren(dir, names);
}
Status FaultInjectionEnv::CreateDirs(const std::string& dir) {
  KEEL_RETURN_IF_ERROR(Before(Op::kMkdir, dir));
  return base_->CreateDirs(dir);
}
Status FaultInjectionEnv::RenameFile(const std::string& from, const std::string& to) {
  KEEL_RETURN_IF_ERROR(Before(Op::kRename, to));
  return base_->RenameFile(from, to);
}
Status FaultInjectionEnv::ExchangePaths(const std::string& a, const std::string& b) {
  KEEL_RETURN_IF_ERROR(Before(Op::kRename, b));
  return base_->ExchangePaths(a, b);
}
Status FaultInjectionEnv::LinkFile(const std::string& from, const std::string& to) {
  KEEL_RETURN_IF_ERROR(Before(Op::kCreate, to));
  return base_->LinkFile(from, to);
}
Status FaultInjectionEnv::RemoveFile(const std::string& path) {
  KEEL_RETURN_IF_ERROR(Before(Op::kRemove, path));
  return base_->RemoveFile(path);
}
Status FaultInjectionEnv::RemoveDirRecursive(const std::string& dir) {
  KEEL_RETURN_IF_ERROR(Before(Op::kRemove, dir));
  return base_->RemoveDirRecursive(dir);
}
Status FaultInjectionEnv::SyncDir(const std::string& dir) {
  KEEL_RETURN_IF_ERROR(Before(Op::kSync, dir));
  return base_->SyncDir(dir);
}

}  // namespace keel

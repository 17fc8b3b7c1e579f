// MemEnv: an Env whose files and directories live in memory, so a fuzz target can hand a parser
// that reads through an Env (datasets, checkpoints, run directories) its input without touching
// the disk: thousands of executions a second, nothing left behind. POSIX semantics where keel
// relies on them: a file needs its parent directory, rename replaces, links share contents.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/env.h"

namespace keel::fuzz {

class MemEnv : public Env {
 public:
  MemEnv() { dirs_.insert("/"); }

  // Test set-up: a file with `contents`, its directories created.
  void Put(const std::string& path, std::string_view contents) {
    (void)CreateDirs(Parent(path));
    files_[path] = std::make_shared<std::string>(contents);
  }

  Status NewWritableFile(const std::string& path, std::unique_ptr<WritableFile>* out) override {
    return Open(path, /*truncate=*/true, out);
  }
  Status NewAppendableFile(const std::string& path, std::unique_ptr<WritableFile>* out) override {
    return Open(path, /*truncate=*/false, out);
  }
  using Env::ReadFileToString;
  // The cap is the real Env's: a reader's limit is fuzzed with the reader.
  Status ReadFileToString(const std::string& path, std::string* out, uint64_t max_bytes) override {
    auto it = files_.find(path);
    if (it == files_.end()) return Status::IOError("cannot open '" + path + "': no such file");
    if (it->second->size() > max_bytes) return FileTooLarge(path, max_bytes);
    *out = *it->second;
    return Status::OK();
  }
  Status MapReadOnly(const std::string& path, std::unique_ptr<ReadOnlyRegion>* out) override {
    auto it = files_.find(path);
    if (it == files_.end()) return Status::IOError("cannot open '" + path + "': no such file");
    // A copy of exactly the file's bytes, so reads past its end are caught by AddressSanitizer.
    *out = std::make_unique<Region>(*it->second);
    return Status::OK();
  }
  bool FileExists(const std::string& path) override {
    return files_.count(path) > 0 || dirs_.count(path) > 0;
  }
  bool IsDirectory(const std::string& path) override { return dirs_.count(path) > 0; }
  Status GetFileSize(const std::string& path, uint64_t* size) override {
    auto it = files_.find(path);
    if (it == files_.end()) return Status::IOError("cannot stat '" + path + "': no such file");
    *size = it->second->size();
    return Status::OK();
  }
  Status GetChildren(const std::string& dir, std::vector<std::string>* names) override {
    names->clear();
    if (!IsDirectory(dir)) return Status::IOError("cannot list '" + dir + "': not a directory");
    for (const auto& [p, f] : files_)
      if (Parent(p) == dir) names->push_back(p.substr(p.rfind('/') + 1));
    for (const std::string& d : dirs_)
      if (d != "/" && Parent(d) == dir) names->push_back(d.substr(d.rfind('/') + 1));
    return Status::OK();
  }
  Status CreateDirs(const std::string& dir) override {
    if (files_.count(dir)) return Status::IOError("cannot create '" + dir + "': a file");
    for (std::string d = dir; !d.empty() && d != "/"; d = Parent(d)) dirs_.insert(d);
    return Status::OK();
  }
  Status RenameFile(const std::string& from, const std::string& to) override {
    if (!IsDirectory(Parent(to))) return Status::IOError("cannot rename to '" + to + "'");
    if (auto it = files_.find(from); it != files_.end()) {
      auto f = it->second;
      files_.erase(it);
      files_[to] = std::move(f);
      return Status::OK();
    }
    if (!IsDirectory(from)) return Status::IOError("cannot rename '" + from + "': no such file");
    // A directory: move everything under it.
    const std::string pre = from + "/";
    std::map<std::string, std::shared_ptr<std::string>> moved;
    for (auto it = files_.begin(); it != files_.end();) {
      if (it->first.rfind(pre, 0) == 0) {
        moved[to + it->first.substr(from.size())] = it->second;
        it = files_.erase(it);
      } else {
        ++it;
      }
    }
    std::set<std::string> dirs;
    for (auto it = dirs_.begin(); it != dirs_.end();) {
      if (*it == from || it->rfind(pre, 0) == 0) {
        dirs.insert(to + it->substr(from.size()));
        it = dirs_.erase(it);
      } else {
        ++it;
      }
    }
    files_.insert(moved.begin(), moved.end());
    dirs_.insert(dirs.begin(), dirs.end());
    return Status::OK();
  }
  Status ExchangePaths(const std::string& a, const std::string& b) override {
    const std::string tmp = a + ".memenv-exchange";
    KEEL_RETURN_IF_ERROR(RenameFile(a, tmp));
    KEEL_RETURN_IF_ERROR(RenameFile(b, a));
    return RenameFile(tmp, b);
  }
  Status LinkFile(const std::string& from, const std::string& to) override {
    auto it = files_.find(from);
    if (it == files_.end() || files_.count(to) || !IsDirectory(Parent(to)))
      return Status::IOError("cannot link '" + from + "' to '" + to + "'");
    files_[to] = it->second;
    return Status::OK();
  }
  Status RemoveFile(const std::string& path) override {
    if (files_.erase(path) == 0) return Status::IOError("cannot remove '" + path + "'");
    return Status::OK();
  }
  Status RemoveDirRecursive(const std::string& dir) override {
    const std::string pre = dir + "/";
    std::erase_if(files_, [&](const auto& kv) { return kv.first.rfind(pre, 0) == 0; });
    std::erase_if(dirs_, [&](const std::string& d) { return d == dir || d.rfind(pre, 0) == 0; });
    return Status::OK();
  }
  Status SyncDir(const std::string& dir) override {
    return IsDirectory(dir) ? Status::OK() : Status::IOError("cannot sync '" + dir + "'");
  }
  uint64_t NowMicros() override { return now_ += 1000; }
  void SleepForMicros(uint64_t micros) override { now_ += micros; }
  // As flock: one holder at a time, the file holds the holder's description, emptied on release.
  Status LockFile(const std::string& path, const std::string& me, std::unique_ptr<FileLock>* lock,
                  std::string* previous) override {
    lock->reset();
    auto& file = files_[path];
    if (!file) file = std::make_shared<std::string>();
    *previous = *file;
    if (locked_.count(path)) return Status::OK();
    *file = me;
    locked_.insert(path);
    *lock = std::make_unique<Lock>(this, path);
    return Status::OK();
  }

 private:
  class Lock : public FileLock {
   public:
    Lock(MemEnv* env, std::string path) : env_(env), path_(std::move(path)) {}
    ~Lock() override {
      env_->locked_.erase(path_);
      if (auto it = env_->files_.find(path_); it != env_->files_.end()) it->second->clear();
    }

   private:
    MemEnv* env_;
    std::string path_;
  };
  class Region : public ReadOnlyRegion {
   public:
    explicit Region(const std::string& s) : bytes_(new char[s.size()]), size_(s.size()) {
      if (size_ > 0) s.copy(bytes_.get(), size_);
    }
    const char* data() const override { return bytes_.get(); }
    size_t size() const override { return size_; }

   private:
    std::unique_ptr<char[]> bytes_;
    size_t size_;
  };
  class File : public WritableFile {
   public:
    explicit File(std::shared_ptr<std::string> f) : f_(std::move(f)) {}
    Status Append(std::string_view data) override {
      f_->append(data);
      return Status::OK();
    }
    Status Flush() override { return Status::OK(); }
    Status Sync() override { return Status::OK(); }
    Status Close() override { return Status::OK(); }

   private:
    std::shared_ptr<std::string> f_;
  };

  static std::string Parent(const std::string& path) {
    const size_t slash = path.rfind('/');
    if (slash == std::string::npos) return ".";
    return slash == 0 ? "/" : path.substr(0, slash);
  }
  Status Open(const std::string& path, bool truncate, std::unique_ptr<WritableFile>* out) {
    if (!IsDirectory(Parent(path)) || IsDirectory(path))
      return Status::IOError("cannot open for writing '" + path + "'");
    auto& f = files_[path];
    if (f == nullptr) f = std::make_shared<std::string>();
    if (truncate) f->clear();  // O_TRUNC: every link to the file sees it emptied
    *out = std::make_unique<File>(f);
    return Status::OK();
  }

  std::map<std::string, std::shared_ptr<std::string>> files_;
  std::set<std::string> dirs_;
  std::set<std::string> locked_;  // paths a Lock holds
  uint64_t now_ = 0;
};

}  // namespace keel::fuzz

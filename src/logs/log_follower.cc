#include "logs/log_follower.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace keel {
namespace {

// A line this long is not a log line being written but a file without newlines: it is let go.
constexpr size_t kMaxLineBytes = 1 << 20;

bool Compressed(const std::string& name) {
  for (const char* ext : {".gz", ".bz2", ".xz", ".zst", ".lz4", ".zip", ".Z"})
    if (name.ends_with(ext)) return true;
  return false;
}

}  // namespace

LogFollower::LogFollower(Env* env, std::string path) : env_(env), path_(std::move(path)) {}

Status LogFollower::CheckFollowable(Env* env, const std::string& path) {
  FileType type = FileType::kRegular;
  const Status st = env->GetFileType(path, &type);
  if (st.code() == Status::Code::kNotFound) return Status::OK();  // not yet: waited for
  if (!st.ok()) return st;
  if (type == FileType::kRegular) return Status::OK();
  if (type == FileType::kDirectory)
    return Status::InvalidArgument(
        fmt::format("{} is a directory, not a log file: give the file the training run writes "
                    "(e.g. its main_log.txt)",
                    path));
  return Status::InvalidArgument(fmt::format(
      "'{}' is {}, not a regular file: logs watch follows a log file by its offsets, through "
      "rotations, and opening a pipe would block it; have the run write its log to a file (e.g. "
      "`... 2>&1 | tee main_log.txt`) and watch that file",
      path, DescribeFileType(type)));
}

Status LogFollower::Read(const std::string& file, uint64_t from, size_t n, std::string* out) {
  return env_->ReadFileRange(file, from, n, out);
}

Status LogFollower::SameFile(const std::string& file, uint64_t size, bool* same) {
  *same = false;
  if (size < offset_) return Status::OK();
  std::string got;
  KEEL_RETURN_IF_ERROR(Read(file, 0, head_.size(), &got));
  if (got != head_) return Status::OK();
  KEEL_RETURN_IF_ERROR(Read(file, offset_ - tail_.size(), tail_.size(), &got));
  *same = got == tail_;
  return Status::OK();
}

void LogFollower::Remember(std::string_view bytes) {
  if (head_.size() < kKeep) head_.append(bytes.substr(0, kKeep - head_.size()));
  if (bytes.size() >= kKeep) {
    tail_.assign(bytes.substr(bytes.size() - kKeep));
  } else {
    tail_.append(bytes);
    if (tail_.size() > kKeep) tail_.erase(0, tail_.size() - kKeep);
  }
}

void LogFollower::Consume(std::string_view bytes, std::vector<FollowedItem>* items) {
  bool nul = false;
  for (size_t start = 0;;) {
    const size_t nl = bytes.find('\n', start);
    const std::string_view piece =
        bytes.substr(start, nl == std::string_view::npos ? std::string_view::npos : nl - start);
    if (std::memchr(piece.data(), '\0', piece.size()) != nullptr) {
      nul = true;
      for (char c : piece)
        if (c != '\0') partial_ += c;
    } else {
      partial_.append(piece);
    }
    if (nl == std::string_view::npos) break;
    items->push_back({FollowedItem::Kind::kLine, std::move(partial_)});
    partial_.clear();
    start = nl + 1;
  }
  if (partial_.size() > kMaxLineBytes) {
    items->push_back({FollowedItem::Kind::kLine, std::move(partial_)});
    partial_.clear();
  }
  if (nul && !said_nul_) {
    said_nul_ = true;
    items->push_back({FollowedItem::Kind::kNote,
                      fmt::format("{}: NUL bytes dropped (the hole a writer without O_APPEND "
                                  "leaves when it writes on after a copytruncate)",
                                  path_)});
  }
}

void LogFollower::StartOver() {
  offset_ = 0;
  head_.clear();
  tail_.clear();
  said_nul_ = false;
}

Status LogFollower::DrainRotated(std::vector<FollowedItem>* items) {
  if (head_.empty()) return Status::OK();  // nothing read: nothing to continue
  const size_t slash = path_.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path_.substr(0, slash);
  const std::string base = path_.substr(slash == std::string::npos ? 0 : slash + 1);
  std::vector<std::string> names;
  if (!env_->GetChildren(dir, &names).ok()) return Status::OK();
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    if (name.size() <= base.size() || name.compare(0, base.size(), base) != 0) continue;
    if (std::strchr(".-_", name[base.size()]) == nullptr || Compressed(name)) continue;
    const std::string file = slash == std::string::npos ? name : JoinPath(dir, name);
    uint64_t size = 0;
    bool same = false;
    if (env_->IsDirectory(file) || !env_->GetFileSize(file, &size).ok() ||
        !SameFile(file, size, &same).ok() || !same)
      continue;
    uint64_t from = offset_;
    while (from < size) {
      std::string bytes;
      KEEL_RETURN_IF_ERROR(
          Read(file, from, std::min<uint64_t>(size - from, kMaxReadBytes), &bytes));
      if (bytes.empty()) break;
      from += bytes.size();
      bytes_read_ += bytes.size();
      Consume(bytes, items);
    }
    if (from > offset_)
      items->push_back({FollowedItem::Kind::kNote,
                        fmt::format("read the last {} bytes {} got before it was rotated from {}",
                                    from - offset_, path_, file)});
    return Status::OK();
  }
  return Status::OK();
}

Status LogFollower::Poll(std::vector<FollowedItem>* items, bool* more) {
  items->clear();
  *more = false;
  auto flush_partial = [&] {
    if (partial_.empty()) return;
    items->push_back({FollowedItem::Kind::kLine, std::move(partial_)});
    partial_.clear();
  };
  // A symbolic link loop or a FIFO is not a file that is not there yet: it ends the watch.
  KEEL_RETURN_IF_ERROR(CheckFollowable(env_, path_));
  if (!env_->FileExists(path_)) {
    if (state_ == State::kReading) {
      KEEL_RETURN_IF_ERROR(DrainRotated(items));
      flush_partial();
      items->push_back({FollowedItem::Kind::kNote,
                        fmt::format("{} is gone (rotated or removed) after {} bytes: waiting for "
                                    "a new one",
                                    path_, offset_)});
      state_ = State::kGone;
      StartOver();
    } else if (state_ == State::kNotYet && !said_missing_) {
      said_missing_ = true;
      items->push_back(
          {FollowedItem::Kind::kNote, fmt::format("{} does not exist yet: waiting for it", path_)});
    }
    return Status::OK();
  }
  uint64_t size = 0;
  Status st = env_->GetFileSize(path_, &size);
  if (!st.ok()) return env_->FileExists(path_) ? st : Status::OK();  // gone: the next Poll says
  if (state_ != State::kReading) {
    if (state_ == State::kGone)
      items->push_back({FollowedItem::Kind::kNewFile,
                        fmt::format("{} is back: reading the new file from its start", path_)});
    else if (said_missing_)
      items->push_back({FollowedItem::Kind::kNote, fmt::format("{} appeared", path_)});
    state_ = State::kReading;
    ++files_;
    StartOver();
  } else {
    bool same = false;
    st = SameFile(path_, size, &same);
    if (!st.ok()) return env_->FileExists(path_) ? st : Status::OK();
    if (!same) {
      const uint64_t read = offset_;
      KEEL_RETURN_IF_ERROR(DrainRotated(items));
      flush_partial();
      items->push_back(
          {FollowedItem::Kind::kNewFile,
           size < read ? fmt::format("{} is shorter ({} bytes) than the {} bytes read: it was "
                                     "truncated or replaced; reading it from its start",
                                     path_, size, read)
                       : fmt::format("{} is another file now (the bytes read are not at its "
                                     "start): it was rotated; reading the new file from its start",
                                     path_)});
      StartOver();
      ++files_;
    }
  }
  if (size > offset_) {
    std::string bytes;
    st = Read(path_, offset_, std::min<uint64_t>(size - offset_, kMaxReadBytes), &bytes);
    if (!st.ok()) return env_->FileExists(path_) ? st : Status::OK();
    offset_ += bytes.size();
    bytes_read_ += bytes.size();
    Remember(bytes);
    Consume(bytes, items);
    *more = !bytes.empty() && offset_ < size;
  }
  return Status::OK();
}

bool LogFollower::TakePartialLine(std::string* line) {
  if (partial_.empty()) return false;
  *line = std::move(partial_);
  partial_.clear();
  return true;
}

}  // namespace keel

// LogFollower: the lines another process writes to a log file, followed as `tail -F` follows it,
// through the Env (tests fake the file system and the clock):
//   - appends: each Poll returns the complete lines added since the last one; a partial last line
//     waits for the rest of it
//   - a file that does not exist yet, or is gone for a while: Poll waits for it
//   - truncation (`copytruncate`, `> log`) and rotation by rename (logrotate's default: the file
//     is renamed and a new one created): the file at the path is then shorter than what was read,
//     or its first bytes or the bytes just before the read position are not the ones read. What
//     the old file got after the last Poll is taken from its rotated copy (a file beside it named
//     PATH.1, PATH-20240501, ... that holds the same bytes), then the new file is read from its
//     start
//   - a FIFO, device or socket at the path, or a symbolic link loop, is an error (CheckFollowable):
//     neither is a file being written that waiting could turn into one
//   - NUL bytes (the hole a writer without O_APPEND leaves after a copytruncate) are dropped
// A file is recognised by its content, not its inode: the Env has no inodes, and the check works
// on any file system. Lines a writer adds to the old file after the rotation was seen are not read
// (a writer that reopens its log late).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/env.h"
#include "core/status.h"

namespace keel {

// One item of what a Poll found, in order.
struct FollowedItem {
  enum class Kind {
    kLine,     // a complete line (without its "\n")
    kNewFile,  // the lines that follow are another file's (rotated, truncated), from its start
    kNote,     // something a person watching should know (the file appeared, is gone, ...)
  };
  Kind kind = Kind::kLine;
  std::string text;
};

class LogFollower {
 public:
  LogFollower(Env* env, std::string path);

  // OK when `path` is a regular file or nothing (yet); InvalidArgument naming what it is
  // otherwise: a directory, a FIFO, device or socket (a follower reads by offset, and opening a
  // FIFO blocks), or a symbolic link loop (which is not a file that will appear).
  static Status CheckFollowable(Env* env, const std::string& path);

  // What was written since the last call. Never blocks. At most kMaxReadBytes of the file are
  // read per call; `more` says there is more to read now. An error only for what waiting cannot
  // mend (the path is a directory, the file cannot be read).
  Status Poll(std::vector<FollowedItem>* items, bool* more);
  // The end of the watch: a last line that never got its newline, as a line (false: none).
  bool TakePartialLine(std::string* line);

  bool exists() const { return state_ == State::kReading; }
  const std::string& path() const { return path_; }
  uint64_t bytes_read() const { return bytes_read_; }  // in total, over every file
  int64_t files() const { return files_; }             // files read (1 + rotations, truncations)

  static constexpr size_t kMaxReadBytes = 8 << 20;

 private:
  enum class State { kNotYet, kReading, kGone };
  // The bytes [from, from + n) of `file` (fewer at its end).
  Status Read(const std::string& file, uint64_t from, size_t n, std::string* out);
  // True when `file` holds the bytes this follower read: the same first bytes, and the same bytes
  // just before the read position.
  Status SameFile(const std::string& file, uint64_t size, bool* same);
  // Takes what the old file got after the last read from its rotated copy, if one is there.
  Status DrainRotated(std::vector<FollowedItem>* items);
  void Consume(std::string_view bytes, std::vector<FollowedItem>* items);
  void Remember(std::string_view bytes);  // the head and tail of what was read
  void StartOver();

  Env* env_;
  std::string path_;
  State state_ = State::kNotYet;
  uint64_t offset_ = 0;  // bytes of the current file consumed
  std::string head_;     // its first bytes (up to kKeep)
  std::string tail_;     // the kKeep bytes before offset_
  std::string partial_;  // a line still waiting for its "\n"
  bool said_missing_ = false, said_nul_ = false;
  uint64_t bytes_read_ = 0;
  int64_t files_ = 0;
  static constexpr size_t kKeep = 256;
};

}  // namespace keel

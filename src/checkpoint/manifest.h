// Manifest: the list of every file of a checkpoint with its size and xxh3-64 checksum, written
// last inside the checkpoint directory. A checkpoint is loaded only if its directory holds exactly
// the manifest's files, each with the recorded size and checksum: a stray `.orig` backup, a
// missing or truncated file, a flipped byte are all errors that name the file.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/env.h"
#include "core/status.h"

namespace keel {

constexpr const char* kManifestFile = "manifest.json";

// The fix a message about a malformed checkpoint file offers: keel wrote it, so it was damaged or
// edited; other checkpoints of the run remain.
constexpr const char* kDamagedCheckpointFix =
    "keel wrote this file, so it was damaged or edited by hand: restore it from a copy, or use "
    "another checkpoint of the run (`keel ckpt list SAVE`, then --load SAVE/iter_N)";

struct ManifestEntry {
  std::string name;  // relative to the checkpoint directory, no subdirectories
  uint64_t size = 0;
  uint64_t xxh3 = 0;
};

struct Manifest {
  int64_t iteration = 0;
  std::vector<ManifestEntry> files;
  std::string ToJson() const;
  static Status FromJson(const std::string& text, const std::string& path, Manifest* out);
  const ManifestEntry* Find(const std::string& name) const;
};

// A WritableFile that forwards to another and keeps the size and xxh3 of what went through it, so
// a save never reads its files back to checksum them.
class ChecksummingFile : public WritableFile {
 public:
  explicit ChecksummingFile(std::unique_ptr<WritableFile> base);
  ~ChecksummingFile() override;
  Status Append(std::string_view data) override;
  Status Flush() override { return base_->Flush(); }
  Status Sync() override { return base_->Sync(); }
  Status Close() override { return base_->Close(); }
  uint64_t size() const { return size_; }
  uint64_t digest() const;

 private:
  std::unique_ptr<WritableFile> base_;
  void* state_;  // XXH3_state_t
  uint64_t size_ = 0;
};

uint64_t Xxh3(const char* data, size_t size);
std::string HexDigest(uint64_t v);

// "iter_0000100" for 100 (7 digits, as Megatron names them).
std::string CheckpointDirName(int64_t iteration);
// Parses "iter_0000100" into 100; false for anything else (e.g. "iter_0000100.corrupt").
bool ParseCheckpointDirName(const std::string& name, int64_t* iteration);

// Reads and parses `dir`/manifest.json; Corruption when it is missing or malformed.
Status ReadManifest(Env* env, const std::string& dir, Manifest* out);

// A checkpoint's identity is its manifest's iteration, not its directory's name: Corruption,
// naming both numbers and the fix, when `dir` is named iter_N and `m` says another iteration (a
// copy such as `cp -r iter_0000010 iter_0000099`, or a renamed directory). A directory not named
// iter_N (a copy elsewhere, iter_N.corrupt) claims no iteration and passes.
Status CheckCheckpointIdentity(const std::string& dir, const Manifest& m);

// Checks `dir` strictly against its manifest (see the header comment) and its identity
// (CheckCheckpointIdentity). With `check_contents` false only names and sizes are compared (fast
// listing); true also recomputes every checksum.
Status VerifyCheckpointDir(Env* env, const std::string& dir, bool check_contents, Manifest* out);

}  // namespace keel

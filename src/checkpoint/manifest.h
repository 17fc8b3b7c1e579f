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

// Checks `dir` strictly against its manifest (see the header comment). With `check_contents`
// false only names and sizes are compared (fast listing); true also recomputes every checksum.
Status VerifyCheckpointDir(Env* env, const std::string& dir, bool check_contents, Manifest* out);

}  // namespace keel

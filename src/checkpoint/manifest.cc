#include "checkpoint/manifest.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <charconv>
#include <nlohmann/json.hpp>
#include <set>

#include "core/json_field.h"

namespace keel {

std::string HexDigest(uint64_t v) {
  return fmt::format("{:016x}", v);
}

uint64_t Xxh3(const char* data, size_t size) {
  return XXH3_64bits(data, size);
}

std::string Manifest::ToJson() const {
  nlohmann::ordered_json j;
  j["format"] = "keel-checkpoint";
  j["format_version"] = 1;
  j["iteration"] = iteration;
  j["checksum"] = "xxh3-64";
  j["files"] = nlohmann::ordered_json::array();
  for (const ManifestEntry& e : files)
    j["files"].push_back({{"name", e.name}, {"size", e.size}, {"xxh3", HexDigest(e.xxh3)}});
  return j.dump(2) + "\n";
}

Status Manifest::FromJson(const std::string& text, const std::string& path, Manifest* out) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || JsonStringOr(j, "format", "") != "keel-checkpoint")
    return Status::Corruption(path + " is not a keel checkpoint manifest");
  auto malformed = [&](const std::string& what) {
    return Status::Corruption(path + ": malformed manifest: " + what);
  };
  if (!j.contains("format_version")) return malformed("no format_version");
  if (JsonIntField<int>(j, "format_version") != 1)
    return Status::Corruption(path + ": manifest format_version " + j["format_version"].dump() +
                              " is not supported by this keel (" KEEL_VERSION ")");
  const auto iteration = JsonIntField<int64_t>(j, "iteration");
  if (!iteration || *iteration < 0) return malformed("iteration is not a non-negative integer");
  out->iteration = *iteration;
  out->files.clear();
  const auto files = j.find("files");
  if (files == j.end() || !files->is_array()) return malformed("files is not a list");
  for (const nlohmann::json& f : *files) {
    ManifestEntry e;
    e.name = JsonStringOr(f, "name", "");
    if (e.name.empty()) return malformed("an entry of files has no name");
    const auto size = JsonIntField<uint64_t>(f, "size");
    if (!size) return malformed(e.name + ": size is not a non-negative integer");
    e.size = *size;
    // 16 hex digits, as ToJson writes them.
    const std::string hex = JsonStringOr(f, "xxh3", "");
    const auto [end, ec] = std::from_chars(hex.data(), hex.data() + hex.size(), e.xxh3, 16);
    if (hex.size() != 16 || ec != std::errc() || end != hex.data() + hex.size())
      return malformed(e.name + ": xxh3 is not 16 hex digits");
    out->files.push_back(std::move(e));
  }
  return Status::OK();
}

const ManifestEntry* Manifest::Find(const std::string& name) const {
  for (const ManifestEntry& e : files)
    if (e.name == name) return &e;
  return nullptr;
}

ChecksummingFile::ChecksummingFile(std::unique_ptr<WritableFile> base)
    : base_(std::move(base)), state_(XXH3_createState()) {
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}
ChecksummingFile::~ChecksummingFile() {
  XXH3_freeState(static_cast<XXH3_state_t*>(state_));
}
Status ChecksummingFile::Append(std::string_view data) {
  KEEL_RETURN_IF_ERROR(base_->Append(data));
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data.data(), data.size());
  size_ += data.size();
  return Status::OK();
}
uint64_t ChecksummingFile::digest() const {
  return XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_));
}

Status VerifyCheckpointDir(Env* env, const std::string& dir, bool check_contents, Manifest* out) {
  const std::string mpath = JoinPath(dir, kManifestFile);
  if (!env->IsDirectory(dir)) return Status::NotFound(dir + " is not a directory");
  if (!env->FileExists(mpath))
    return Status::Corruption(mpath +
                              " is missing: this is not a complete keel checkpoint (its save was "
                              "interrupted, or another tool wrote it)");
  std::string text;
  KEEL_RETURN_IF_ERROR(env->ReadFileToString(mpath, &text));
  Manifest m;
  KEEL_RETURN_IF_ERROR(Manifest::FromJson(text, mpath, &m));
  std::vector<std::string> children;
  KEEL_RETURN_IF_ERROR(env->GetChildren(dir, &children));
  std::sort(children.begin(), children.end());
  std::set<std::string> present(children.begin(), children.end());
  for (const std::string& c : children) {
    if (c == kManifestFile || m.Find(c) != nullptr) continue;
    return Status::Corruption(
        JoinPath(dir, c) + " is not listed in " + mpath +
        ": keel loads a checkpoint only with exactly the files it was saved with. Move '" + c +
        "' out of the checkpoint directory (keep backups such as .orig files elsewhere), then "
        "retry");
  }
  for (const ManifestEntry& e : m.files) {
    const std::string p = JoinPath(dir, e.name);
    if (present.count(e.name) == 0)
      return Status::Corruption(p + " is missing (listed in " + mpath +
                                "): the checkpoint is incomplete; restore the file or use an "
                                "older checkpoint");
    uint64_t size = 0;
    KEEL_RETURN_IF_ERROR(env->GetFileSize(p, &size));
    if (size != e.size)
      return Status::Corruption(fmt::format(
          "{} has {} bytes but the manifest records {}: the file was truncated or replaced; "
          "restore it or use an older checkpoint",
          p, size, e.size));
    if (check_contents) {
      std::unique_ptr<ReadOnlyRegion> r;
      KEEL_RETURN_IF_ERROR(env->MapReadOnly(p, &r));
      const uint64_t h = Xxh3(r->data(), r->size());
      if (h != e.xxh3)
        return Status::Corruption(fmt::format(
            "{}: xxh3 checksum {} does not match the manifest's {}: the file is corrupt; "
            "restore it or use an older checkpoint",
            p, HexDigest(h), HexDigest(e.xxh3)));
    }
  }
  if (out) *out = std::move(m);
  return Status::OK();
}

}  // namespace keel

#include "checkpoint/manifest.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>
#include <set>

#include "core/json_reader.h"

namespace keel {

std::string HexDigest(uint64_t v) {
  return fmt::format("{:016x}", v);
}

namespace {

bool ParseHexDigest(const std::string& hex, uint64_t* v) {
  if (hex.size() != 16) return false;
  *v = 0;
  for (char c : hex) {
    const int d = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
                  : c >= 'a' && c <= 'f'                      ? c - 'a' + 10
                  : c >= 'A' && c <= 'F'                      ? c - 'A' + 10
                                                              : -1;
    if (d < 0) return false;
    *v = *v << 4 | static_cast<uint64_t>(d);
  }
  return true;
}

}  // namespace

uint64_t Xxh3(const char* data, size_t size) {
  return XXH3_64bits(data, size);
}

std::string CheckpointDirName(int64_t iteration) {
  return fmt::format("iter_{:07d}", iteration);
}

bool ParseCheckpointDirName(const std::string& name, int64_t* iteration) {
  if (name.size() < 6 || name.compare(0, 5, "iter_") != 0) return false;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(name[i])) || i - 5 >= 15) return false;
    v = v * 10 + (name[i] - '0');
  }
  *iteration = v;
  return true;
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
  if (j.is_discarded() || !j.is_object() || !j.contains("format") ||
      j["format"] != "keel-checkpoint")
    return Status::Corruption(path + " is not a keel checkpoint manifest; " +
                              kDamagedCheckpointFix);
  JsonReader r(path, j, kDamagedCheckpointFix);
  const JsonValue root = r.root();
  const JsonValue version = root["format_version"];
  if (version.Get<int64_t>(1) != 1)
    return Status::Corruption(path + ": manifest format_version " + version.raw().dump() +
                              " is not supported by this keel (" KEEL_VERSION ")");
  const JsonValue iteration = root["iteration"];
  out->iteration = iteration.Get<int64_t>();
  if (r.ok() && out->iteration < 0)
    r.Fail(iteration.path(), "must be a non-negative integer, but is " + iteration.raw().dump());
  out->files.clear();
  for (const JsonValue& f : root["files"].Items()) {
    ManifestEntry e;
    e.name = f["name"].Get<std::string>();
    e.size = f["size"].Get<uint64_t>();
    const JsonValue xxh3 = f["xxh3"];
    const std::string hex = xxh3.Get<std::string>();
    if (r.ok() && !ParseHexDigest(hex, &e.xxh3))
      r.Fail(xxh3.path(), "must be 16 hexadecimal digits, but is \"" + hex + "\"");
    out->files.push_back(std::move(e));
  }
  return r.status();
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

Status ReadManifest(Env* env, const std::string& dir, Manifest* out) {
  const std::string mpath = JoinPath(dir, kManifestFile);
  if (!env->FileExists(mpath))
    return Status::Corruption(mpath +
                              " is missing: this is not a complete keel checkpoint (its save was "
                              "interrupted, or another tool wrote it)");
  std::string text;
  KEEL_RETURN_IF_ERROR(env->ReadFileToString(mpath, &text));
  return Manifest::FromJson(text, mpath, out);
}

Status CheckCheckpointIdentity(const std::string& dir, const Manifest& m) {
  std::string path = dir;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const std::string name = path.substr(path.rfind('/') + 1);  // npos + 1 == 0: all of it
  int64_t named = 0;
  if (!ParseCheckpointDirName(name, &named) || named == m.iteration) return Status::OK();
  return Status::Corruption(fmt::format(
      "{}: its manifest says iteration {} but the directory is named {} (iteration {}): this "
      "directory is a copy of {}, or was renamed; move it out of the run directory (keel takes a "
      "checkpoint's iteration from its manifest, never from its name)",
      path, m.iteration, name, named, CheckpointDirName(m.iteration)));
}

Status VerifyCheckpointDir(Env* env, const std::string& dir, bool check_contents, Manifest* out) {
  const std::string mpath = JoinPath(dir, kManifestFile);
  if (!env->IsDirectory(dir)) return Status::NotFound(dir + " is not a directory");
  Manifest m;
  KEEL_RETURN_IF_ERROR(ReadManifest(env, dir, &m));
  KEEL_RETURN_IF_ERROR(CheckCheckpointIdentity(dir, m));
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

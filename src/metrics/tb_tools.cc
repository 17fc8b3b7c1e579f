#include "metrics/tb_tools.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/timestamp.h"
#include "metrics/tf_event.h"

namespace keel {
namespace {

// The tag X that "X vs samples" / "X vs tokens" pairs with ("" for a tag on the iteration axis).
std::string PairedTag(const std::string& tag) {
  const size_t n = TagAxisSuffix(tag).size();
  return n == 0 ? "" : tag.substr(0, tag.size() - n);
}

struct LoadedFile {
  std::string path;
  std::vector<DecodedEvent> events;
};

Status LoadAll(Env* env, const std::string& dir, std::vector<LoadedFile>* out) {
  std::vector<std::string> names;
  KEEL_RETURN_IF_ERROR(ListEventFiles(env, dir, &names));
  if (names.empty())
    return Status::NotFound(dir + " holds no TensorBoard event files (names with 'tfevents')");
  for (const std::string& n : names) {
    LoadedFile f;
    f.path = JoinPath(dir, n);
    std::string bytes;
    KEEL_RETURN_IF_ERROR(env->ReadFileToString(f.path, &bytes));
    Status st = ParseEventFile(bytes, f.path, &f.events);
    if (!st.ok())
      return Status::Corruption(st.message() +
                                "; nothing was changed (move the damaged file aside and retry)");
    out->push_back(std::move(f));
  }
  return Status::OK();
}

Status Replace(Env* env, const std::string& path, const std::string& bytes) {
  return WriteFileAtomic(env, path, bytes);
}

}  // namespace

Status ListEventFiles(Env* env, const std::string& dir, std::vector<std::string>* out) {
  out->clear();
  if (!env->IsDirectory(dir)) return Status::NotFound(dir + " is not a directory");
  std::vector<std::string> names;
  KEEL_RETURN_IF_ERROR(env->GetChildren(dir, &names));
  for (const std::string& n : names)
    if (n.find("tfevents") != std::string::npos && n.find(".tmp") == std::string::npos)
      out->push_back(n);
  std::sort(out->begin(), out->end());
  return Status::OK();
}

Status ParseTagMap(const std::string& text, const std::string& origin,
                   std::map<std::string, std::string>* map) {
  map->clear();
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  bool ok = j.is_object() && !j.empty();
  for (auto it = j.begin(); ok && it != j.end(); ++it) {
    ok = !it.key().empty() && it->is_string() && !it->get<std::string>().empty();
    if (ok) (*map)[it.key()] = it->get<std::string>();
  }
  if (!ok)
    return Status::InvalidArgument(origin +
                                   " must be a JSON object of non-empty tag names, e.g. {\"lm "
                                   "loss\": \"lm-loss-training/lm loss\"}");
  return Status::OK();
}

Status RenameTags(Env* env, const std::string& dir, const std::map<std::string, std::string>& map,
                  TagRenameReport* report) {
  *report = TagRenameReport();
  std::vector<LoadedFile> files;
  KEEL_RETURN_IF_ERROR(LoadAll(env, dir, &files));
  for (const LoadedFile& f : files) {
    ++report->files;
    std::string out;
    bool changed = false;
    for (const DecodedEvent& e : f.events) {
      auto it = e.tag.empty() ? map.end() : map.find(e.tag);
      if (it == map.end()) {
        out += FrameRecord(e.data);
        continue;
      }
      out += FrameRecord(RetagEvent(e.data, it->second));
      ++report->renamed[e.tag];
      changed = true;
    }
    if (!changed) continue;
    KEEL_RETURN_IF_ERROR(Replace(env, f.path, out));
    ++report->files_changed;
  }
  return Status::OK();
}

Status TruncateAfterStep(Env* env, const std::string& dir, int64_t step, TruncateReport* report) {
  *report = TruncateReport();
  std::vector<LoadedFile> files;
  KEEL_RETURN_IF_ERROR(LoadAll(env, dir, &files));
  std::vector<std::string> kept_bytes(files.size());
  for (size_t i = 0; i < files.size(); ++i) {
    std::map<std::string, int64_t> kept_per_tag, seen_per_tag;
    for (const DecodedEvent& e : files[i].events)  // the iteration-axis tags first
      if (PairedTag(e.tag).empty() && e.file_version.empty() && e.step <= step)
        ++kept_per_tag[e.tag];
    for (const DecodedEvent& e : files[i].events) {
      bool keep = true;
      if (e.file_version.empty()) {
        const std::string base = PairedTag(e.tag);
        if (base.empty()) {
          keep = e.step <= step;
        } else {
          // The n-th "X vs samples" event pairs with the n-th "X" event of the file.
          const int64_t n = seen_per_tag[e.tag]++;
          auto it = kept_per_tag.find(base);
          keep = it != kept_per_tag.end() ? n < it->second : true;
        }
      }
      if (keep) {
        kept_bytes[i] += FrameRecord(e.data);
        ++report->kept;
      } else {
        ++report->moved;
      }
    }
  }
  if (report->moved == 0) return Status::OK();
  const std::string arch =
      JoinPath(JoinPath(dir, "tb-archive"),
               fmt::format("truncate-after-step-{}-{}", step, UtcTimestampCompact()));
  KEEL_RETURN_IF_ERROR(env->CreateDirs(arch));
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string name = files[i].path.substr(files[i].path.rfind('/') + 1);
    // Keep the original whole in the archive (a hard link, then the live name is replaced).
    KEEL_RETURN_IF_ERROR(env->LinkFile(files[i].path, JoinPath(arch, name)));
    KEEL_RETURN_IF_ERROR(Replace(env, files[i].path, kept_bytes[i]));
  }
  KEEL_RETURN_IF_ERROR(env->SyncDir(arch));
  report->archive = arch;
  return Status::OK();
}

}  // namespace keel

#include "launch/run_progress.h"

#include <cctype>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "checkpoint/checkpoint_store.h"
#include "metrics/run_metrics.h"

namespace keel {

MetricsProgress ReadMetricsProgress(Env* env, const std::string& run_dir, int64_t after) {
  MetricsProgress p;
  const std::string path = JoinPath(run_dir, kMetricsFile);
  uint64_t size = 0;
  if (!env->FileExists(path) || !env->GetFileSize(path, &size).ok() || size == 0) return p;
  std::unique_ptr<ReadOnlyRegion> region;
  if (!env->MapReadOnly(path, &region).ok()) return p;
  const char* data = region->data();
  size_t end = region->size();
  while (end > 0) {
    size_t begin = end;
    while (begin > 0 && data[begin - 1] != '\n') --begin;
    const nlohmann::json r = nlohmann::json::parse(data + begin, data + end, nullptr, false);
    end = begin > 0 ? begin - 1 : 0;
    if (!r.is_object() || r.value("kind", "") != "train" || !r.contains("iteration") ||
        !r["iteration"].is_number_integer())
      continue;
    const int64_t it = r["iteration"].get<int64_t>();
    if (p.newest_iteration < 0) p.newest_iteration = it;
    if (it <= after) break;  // the file is in iteration order: keel rewinds it on every resume
    ++p.records_after;
    if (r.contains("iteration_ms") && r["iteration_ms"].is_number())
      p.ms_after += r["iteration_ms"].get<double>();
  }
  return p;
}

int64_t ReadCheckpointMarker(Env* env, const std::string& run_dir) {
  CheckpointStore store(env, run_dir, nullptr);
  int64_t it = -1;
  return store.ReadMarker(&it).ok() ? it : -1;
}

std::string NewestHangDump(Env* env, const std::string& run_dir) {
  const std::string dir = JoinPath(run_dir, kHangsDir);
  std::vector<std::string> names;
  if (!env->IsDirectory(dir) || !env->GetChildren(dir, &names).ok()) return "";
  std::string best;
  int64_t best_it = -1;
  for (const std::string& n : names) {
    if (n.rfind("iter_", 0) != 0 || n.size() == 5 || n.size() > 20) continue;
    bool digits = true;
    for (size_t i = 5; i < n.size(); ++i)
      digits = digits && std::isdigit(static_cast<unsigned char>(n[i]));
    if (!digits || !env->IsDirectory(JoinPath(dir, n))) continue;
    const int64_t it = std::stoll(n.substr(5));
    if (it > best_it) best_it = it, best = n;
  }
  return best.empty() ? "" : JoinPath(dir, best);
}

}  // namespace keel

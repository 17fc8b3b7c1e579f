#include "checkpoint/optimizer_shards.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <regex>

#include "checkpoint/manifest.h"

namespace keel {

std::string OptimizerFileName(int rank, int world) {
  if (world <= 1) return "optimizer.safetensors";
  return fmt::format("optimizer.rank-{:03d}-of-{:03d}.safetensors", rank, world);
}

bool IsOptimizerFileName(const std::string& name) {
  static const std::regex re(R"(optimizer(\.rank-\d{3,}-of-\d{3,})?\.safetensors)");
  return std::regex_match(name, re);
}

void AppendMomentPieces(const std::vector<ParamInfo>& params, const std::string& prefix,
                        const ShardRange& shard, const float* m, std::vector<TensorView>* out) {
  for (const ParamInfo& p : params) {
    const size_t lo = std::max(p.offset, shard.begin);
    const size_t hi = std::min(p.offset + p.numel, shard.end);
    if (lo >= hi) continue;
    const float* data = m + (lo - shard.begin);
    if (lo == p.offset && hi == p.offset + p.numel)
      out->push_back({prefix + p.name, p.shape, data});
    else
      out->push_back({fmt::format("{}{}[{}:{}]", prefix, p.name, lo - p.offset, hi - p.offset),
                      {static_cast<int64_t>(hi - lo)},
                      data});
  }
}

Status OptimizerMoments::Open(Env* env, const std::string& dir,
                              const std::vector<std::string>& files,
                              const std::vector<ParamInfo>& params, OptimizerMoments* out) {
  out->files_.clear();
  out->pieces_.clear();
  std::vector<std::string> names;
  for (const std::string& f : files)
    if (IsOptimizerFileName(f)) names.push_back(f);
  std::sort(names.begin(), names.end());
  // Either the one file of a single process, or rank-000..rank-(N-1) of the same N.
  bool complete = names.size() == 1 && names[0] == OptimizerFileName(0, 1);
  if (!complete && !names.empty()) {
    const int world = static_cast<int>(names.size());
    complete = true;
    for (int r = 0; r < world; ++r) complete = complete && names[r] == OptimizerFileName(r, world);
  }
  if (!complete) {
    std::string list;
    for (const std::string& n : names) list += " " + n;
    return Status::Corruption(fmt::format(
        "{}: the optimizer's files are incomplete or mixed (found:{}); a checkpoint holds "
        "optimizer.safetensors, or optimizer.rank-R-of-N.safetensors for every R < N; {}",
        dir, list.empty() ? " none" : list, kDamagedCheckpointFix));
  }
  std::map<std::string, const ParamInfo*> by_name;
  for (const std::string prefix : {"exp_avg.", "exp_avg_sq."})
    for (const ParamInfo& p : params) by_name[prefix + p.name] = &p;
  static const std::regex piece_re(R"((.*)\[(\d+):(\d+)\])");
  out->files_.resize(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    MappedSafetensors& f = out->files_[i];
    KEEL_RETURN_IF_ERROR(MappedSafetensors::Open(env, JoinPath(dir, names[i]), &f));
    for (const auto& [name, ref] : f.tensors()) {
      std::smatch m;
      std::string base = name;
      size_t begin = 0, end = 0;
      const bool piece = std::regex_match(name, m, piece_re);
      if (piece) {
        base = m[1];
        begin = std::stoull(m[2]);
        end = std::stoull(m[3]);
      }
      auto it = by_name.find(base);
      if (it == by_name.end())
        return Status::Corruption(
            fmt::format("{}: tensor '{}' is not a moment of this model's parameters; {}", f.path(),
                        name, kDamagedCheckpointFix));
      const ParamInfo& p = *it->second;
      if (!piece) end = p.numel;
      const std::vector<int64_t> shape =
          piece ? std::vector<int64_t>{static_cast<int64_t>(end - begin)} : p.shape;
      const float* data = nullptr;
      if (end <= begin || end > p.numel)
        return Status::Corruption(
            fmt::format("{}: tensor '{}' names elements outside {} (of {}); {}", f.path(), name,
                        base, p.numel, kDamagedCheckpointFix));
      KEEL_RETURN_IF_ERROR(f.GetF32(name, shape, &data));
      out->pieces_[base].push_back({begin, end, data});
    }
  }
  for (const auto& [name, p] : by_name) {
    auto& list = out->pieces_[name];
    std::sort(list.begin(), list.end(),
              [](const Piece& a, const Piece& b) { return a.begin < b.begin; });
    size_t at = 0;
    for (const Piece& pc : list) {
      if (pc.begin != at) break;
      at = pc.end;
    }
    if (at != p->numel || list.empty())
      return Status::Corruption(
          fmt::format("{}: the optimizer files do not hold all of {} ({} elements): {}; {}", dir,
                      name, p->numel,
                      list.empty() ? "it is missing"
                                   : fmt::format("elements from {} on are missing or overlap", at),
                      kDamagedCheckpointFix));
  }
  return Status::OK();
}

void OptimizerMoments::Copy(const std::string& name, size_t from, size_t to, float* dst) const {
  const auto it = pieces_.find(name);
  KEEL_CHECK(it != pieces_.end(), "OptimizerMoments::Copy of an unknown tensor");
  for (const Piece& pc : it->second) {
    const size_t lo = std::max(from, pc.begin), hi = std::min(to, pc.end);
    if (lo < hi) std::memcpy(dst + (lo - from), pc.data + (lo - pc.begin), (hi - lo) * 4);
  }
}

const float* OptimizerMoments::Whole(const std::string& name) const {
  const auto it = pieces_.find(name);
  KEEL_CHECK(it != pieces_.end(), "OptimizerMoments::Whole of an unknown tensor");
  return it->second.size() == 1 ? it->second[0].data : nullptr;
}

void OptimizerMoments::CopyShard(const std::vector<ParamInfo>& params, const std::string& prefix,
                                 const ShardRange& shard, float* dst) const {
  for (const ParamInfo& p : params) {
    const size_t lo = std::max(p.offset, shard.begin);
    const size_t hi = std::min(p.offset + p.numel, shard.end);
    if (lo < hi) Copy(prefix + p.name, lo - p.offset, hi - p.offset, dst + (lo - shard.begin));
  }
}

}  // namespace keel

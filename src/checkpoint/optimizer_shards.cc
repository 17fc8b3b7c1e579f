#include "checkpoint/optimizer_shards.h"

#include <fmt/format.h>

#include <algorithm>

namespace keel {

std::string OptimizerFileName(int rank, int world) {
  if (world <= 1) return "optimizer.safetensors";
  return fmt::format("optimizer.rank-{:03d}-of-{:03d}.safetensors", rank, world);
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

}  // namespace keel

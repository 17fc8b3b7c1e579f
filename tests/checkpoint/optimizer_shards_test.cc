#include "checkpoint/optimizer_shards.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <regex>

#include "core/shard_range.h"
#include "model/gpt.h"

namespace keel {
namespace {

GptSpec TinySpec() {
  GptSpec s;
  s.num_layers = 2;
  s.hidden = 32;
  s.ffn_hidden = 128;
  s.heads = 2;
  s.max_positions = 16;
  s.vocab = 100;
  s.padded_vocab = 128;
  return s;
}

TEST(OptimizerShardsTest, FileNamesOfOneProcessAndOfNRanks) {
  EXPECT_EQ(OptimizerFileName(0, 1), "optimizer.safetensors");
  EXPECT_EQ(OptimizerFileName(1, 4), "optimizer.rank-001-of-004.safetensors");
}

// The pieces N ranks write tile every parameter exactly once: whole tensors keep their shape and
// point at the parameter's first element, cut ones are 1-D element ranges named [a:b].
TEST(OptimizerShardsTest, PiecesOfNRanksTileEveryParameter) {
  const std::vector<ParamInfo> params = GptModel::ParamLayout(TinySpec());
  const size_t n = params.back().offset + params.back().numel;
  std::vector<float> m(n);
  std::iota(m.begin(), m.end(), 0.0f);
  static const std::regex range_re(R"(exp_avg\.(.*)\[(\d+):(\d+)\])");
  for (int world : {1, 2, 3, 5}) {
    std::map<std::string, size_t> covered;  // by parameter: elements written, in order
    for (int r = 0; r < world; ++r) {
      const ShardRange s = ShardOf(n, r, world);
      std::vector<TensorView> t;
      AppendMomentPieces(params, "exp_avg.", s, m.data() + s.begin, &t);
      for (const TensorView& v : t) {
        std::smatch sm;
        std::string base = v.name.substr(8);
        size_t begin = 0, end = 0;
        if (std::regex_match(v.name, sm, range_re)) {
          base = sm[1], begin = std::stoull(sm[2]), end = std::stoull(sm[3]);
          ASSERT_EQ(v.shape, std::vector<int64_t>{static_cast<int64_t>(end - begin)}) << v.name;
        }
        const auto p = std::find_if(params.begin(), params.end(),
                                    [&](const ParamInfo& q) { return q.name == base; });
        ASSERT_NE(p, params.end()) << v.name;
        if (end == 0) {
          end = p->numel;
          EXPECT_EQ(v.shape, p->shape) << v.name;
        }
        EXPECT_EQ(covered[base], begin) << v.name << " written by " << world;
        covered[base] = end;
        EXPECT_EQ(v.data[0], m[p->offset + begin]) << v.name;
      }
    }
    for (const ParamInfo& p : params) EXPECT_EQ(covered[p.name], p.numel) << p.name << " " << world;
  }
}

}  // namespace
}  // namespace keel

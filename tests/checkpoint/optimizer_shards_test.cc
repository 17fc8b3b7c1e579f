#include "checkpoint/optimizer_shards.h"

#include <gtest/gtest.h>

#include <numeric>

#include "core/env.h"
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

std::string TempDir(const std::string& name) {
  const std::string d = JoinPath(::testing::TempDir(), "keel_optshards_" + name);
  Env::Default()->RemoveDirRecursive(d);
  EXPECT_TRUE(Env::Default()->CreateDirs(d).ok());
  return d;
}

// Writes moments m (= v: element i holds i, plus 0.5 for exp_avg_sq) as `world` ranks would.
std::vector<std::string> WriteAsRanks(const std::string& dir, const std::vector<ParamInfo>& params,
                                      const std::vector<float>& m, const std::vector<float>& v,
                                      int world) {
  std::vector<std::string> names;
  for (int r = 0; r < world; ++r) {
    const ShardRange s = ShardOf(m.size(), r, world);
    std::vector<TensorView> t;
    AppendMomentPieces(params, "exp_avg.", s, m.data() + s.begin, &t);
    AppendMomentPieces(params, "exp_avg_sq.", s, v.data() + s.begin, &t);
    names.push_back(OptimizerFileName(r, world));
    EXPECT_TRUE(WriteSafetensors(Env::Default(), JoinPath(dir, names.back()), t, {}).ok());
  }
  return names;
}

TEST(OptimizerShardsTest, MomentsWrittenByNRanksLoadOnMRanks) {
  const std::vector<ParamInfo> params = GptModel::ParamLayout(TinySpec());
  const size_t n = params.back().offset + params.back().numel;
  std::vector<float> m(n), v(n);
  std::iota(m.begin(), m.end(), 0.0f);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i) + 0.5f;
  for (int writers : {1, 2, 3}) {
    std::string name = "writers";
    name += std::to_string(writers);
    const std::string dir = TempDir(name);
    const std::vector<std::string> files = WriteAsRanks(dir, params, m, v, writers);
    OptimizerMoments om;
    ASSERT_TRUE(OptimizerMoments::Open(Env::Default(), dir, files, params, &om).ok());
    EXPECT_EQ(om.num_files(), writers);
    // Tensors are read in place unless the writers' shards cut them (then they are copied).
    for (const ParamInfo& p : params) {
      bool cut = false;
      for (int r = 0; r + 1 < writers; ++r) {
        const size_t at = ShardOf(n, r, writers).end;  // a boundary between two ranks' files
        cut = cut || (p.offset < at && at < p.offset + p.numel);
      }
      const float* whole = om.Whole("exp_avg." + p.name);
      EXPECT_EQ(whole == nullptr, cut) << p.name << " written by " << writers;
      if (whole != nullptr) {
        EXPECT_EQ(whole[p.numel - 1], m[p.offset + p.numel - 1]) << p.name;
      }
    }
    for (int readers : {1, 2, 3, 5}) {
      for (int r = 0; r < readers; ++r) {
        const ShardRange s = ShardOf(n, r, readers);
        std::vector<float> got(s.size());
        om.CopyShard(params, "exp_avg_sq.", s, got.data());
        for (size_t i = 0; i < s.size(); ++i)
          ASSERT_EQ(got[i], v[s.begin + i]) << writers << "->" << readers << " rank " << r;
      }
    }
  }
}

TEST(OptimizerShardsTest, AMissingRankFileOrPieceIsCorruptionNamingIt) {
  const std::vector<ParamInfo> params = GptModel::ParamLayout(TinySpec());
  const size_t n = params.back().offset + params.back().numel;
  std::vector<float> m(n, 1.0f);
  const std::string dir = TempDir("missing");
  std::vector<std::string> files = WriteAsRanks(dir, params, m, m, 3);
  files.erase(files.begin() + 1);
  OptimizerMoments om;
  Status st = OptimizerMoments::Open(Env::Default(), dir, files, params, &om);
  EXPECT_EQ(st.code(), Status::Code::kCorruption);
  EXPECT_NE(st.message().find("incomplete or mixed"), std::string::npos) << st.message();
  // A file of rank 1 that holds less than its shard: the gap is named.
  const ShardRange s = ShardOf(n, 1, 3);
  std::vector<TensorView> t;
  AppendMomentPieces(params, "exp_avg.", {s.begin, s.end - 1}, m.data() + s.begin, &t);
  AppendMomentPieces(params, "exp_avg_sq.", s, m.data() + s.begin, &t);
  ASSERT_TRUE(WriteSafetensors(Env::Default(), JoinPath(dir, OptimizerFileName(1, 3)), t, {}).ok());
  files.insert(files.begin() + 1, OptimizerFileName(1, 3));
  st = OptimizerMoments::Open(Env::Default(), dir, files, params, &om);
  EXPECT_EQ(st.code(), Status::Code::kCorruption);
  EXPECT_NE(st.message().find("do not hold all of exp_avg."), std::string::npos) << st.message();
}

}  // namespace
}  // namespace keel

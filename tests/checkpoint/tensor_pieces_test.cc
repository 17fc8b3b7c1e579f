// Checkpoints saved at one (tensor T, pipeline P, data D) layout load at any other: several
// "ranks" in one process write their pieces into one staging directory, rank 0 commits, and every
// rank of another layout reads back exactly ExtractShard of the original tensors.
#include "checkpoint/tensor_pieces.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <tuple>

#include "../model/test_shapes.h"
#include "checkpoint/checkpoint_store.h"
#include "core/shard_range.h"
#include "model/gpt.h"

namespace keel {
namespace {

// Four layers: P = 1, 2 and 4 split them evenly.
constexpr test_shapes::Sizes kSizes{4, 32, 100, 128};
GptSpec Gpt2Spec() {
  return test_shapes::Gpt2(kSizes);
}
GptSpec LlamaSpec() {
  return test_shapes::Llama(kSizes);
}

// The full model: pattern values, distinct per tensor and per buffer.
struct FullModel {
  GptSpec spec;
  std::vector<ParamInfo> params;
  std::vector<float> w, m, v;
};

FullModel MakeFull(const GptSpec& spec) {
  FullModel f{spec, GptModel::ParamLayout(spec), {}, {}, {}};
  const size_t n = f.params.back().offset + f.params.back().numel;
  f.w.resize(n), f.m.resize(n), f.v.resize(n);
  for (size_t i = 0; i < n; ++i) {
    f.w[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
    f.m[i] = static_cast<float>(i) * 1e-3f;
    f.v[i] = 1.0f + static_cast<float>(i) * 1e-4f;
  }
  return f;
}

// Megatron's default split: L / P consecutive layers per stage; the embedding on the first, the
// final norm and output layer on the last (which also holds the tied embedding's copy).
int StageOf(const std::string& name, int layers, int pipeline) {
  if (name.rfind("layers.", 0) == 0) return std::stoi(name.substr(7)) / (layers / pipeline);
  return name.rfind("embedding.", 0) == 0 ? 0 : pipeline - 1;
}

// One rank's tensors: slices cut from the full model (or buffers to fill), ZeRO-1 moment ranges.
struct RankTensors {
  std::vector<LocalTensor> list;
  std::vector<std::vector<float>> w, m, v;  // per tensor
};

RankTensors LocalOf(const FullModel& f, const PieceCoords& c, bool cut) {
  RankTensors r;
  std::vector<const ParamInfo*> mine;
  std::vector<bool> copy;
  for (const ParamInfo& p : f.params) {
    const int stage = StageOf(p.name, f.spec.num_layers, c.pipeline);
    const bool tied_copy = !f.spec.untie_embeddings && c.pipeline > 1 && c.pp == c.pipeline - 1 &&
                           p.name == "embedding.word_embeddings.weight";
    if (stage != c.pp && !tied_copy) continue;
    mine.push_back(&p);
    copy.push_back(tied_copy);
  }
  size_t local_n = 0;
  for (const ParamInfo* p : mine) {
    LocalTensor t;
    t.name = p->name;
    t.full_shape = p->shape;
    t.split = TensorSplitOf(f.spec, p->name, p->shape);
    t.tensor_rank = c.tp, t.tensor_size = c.tensor;
    r.list.push_back(t);
    local_n += t.slice_numel();
  }
  // The flat buffer of this (tp, pp) position, its data rank's ZeRO-1 shard.
  const ShardRange shard = ShardOf(local_n, c.dp, c.data);
  size_t at = 0;
  r.w.resize(mine.size()), r.m.resize(mine.size()), r.v.resize(mine.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    LocalTensor& t = r.list[i];
    const ParamInfo& p = *mine[i];
    const size_t n = t.slice_numel();
    t.owner = !copy[i];
    t.moment_begin = std::max(at, shard.begin) - at;
    t.moment_end = std::max(std::min(at + n, shard.end), at) - at;
    if (t.moment_end <= t.moment_begin) t.moment_begin = t.moment_end = 0;
    at += n;
    r.w[i].assign(n, -7.0f);
    std::vector<float> full_m(n), full_v(n);
    if (cut) {
      ExtractShard(f.w.data() + p.offset, p.shape, t.split, c.tp, c.tensor, r.w[i].data());
      ExtractShard(f.m.data() + p.offset, p.shape, t.split, c.tp, c.tensor, full_m.data());
      ExtractShard(f.v.data() + p.offset, p.shape, t.split, c.tp, c.tensor, full_v.data());
    }
    r.m[i].assign(full_m.begin() + t.moment_begin, full_m.begin() + t.moment_end);
    r.v[i].assign(full_v.begin() + t.moment_begin, full_v.begin() + t.moment_end);
    if (!cut) std::fill(r.m[i].begin(), r.m[i].end(), -7.0f);
    if (!cut) std::fill(r.v[i].begin(), r.v[i].end(), -7.0f);
    t.weights = r.w[i].data();
    t.exp_avg = r.m[i].data();
    t.exp_avg_sq = r.v[i].data();
  }
  return r;
}

std::vector<PieceCoords> AllRanks(int tensor, int pipeline, int data) {
  std::vector<PieceCoords> out;
  for (int pp = 0; pp < pipeline; ++pp)
    for (int dp = 0; dp < data; ++dp)
      for (int tp = 0; tp < tensor; ++tp) out.push_back({tp, tensor, pp, pipeline, dp, data});
  return out;
}

// Saves `f` as iteration 1 of `root` at the layout, every rank writing into one staging
// directory, then rank 0's commit of all their manifest entries.
std::string SaveAt(const FullModel& f, const std::string& root, int tensor, int pipeline,
                   int data) {
  Env* env = Env::Default();
  env->RemoveDirRecursive(root);
  CheckpointStore store(env, root, nullptr);
  EXPECT_TRUE(store.BeginSave(1).ok());
  std::vector<ManifestEntry> entries;
  for (const PieceCoords& c : AllRanks(tensor, pipeline, data)) {
    RankTensors r = LocalOf(f, c, /*cut=*/true);
    std::vector<CheckpointFile> files;
    Status st = BuildPieceFiles(c, r.list, /*with_moments=*/true, &files);
    EXPECT_TRUE(st.ok()) << st.message();
    st = store.WriteSaveFiles(1, files, &entries);
    EXPECT_TRUE(st.ok()) << st.message();
  }
  Status st = store.CommitSave(1, entries, env->NowMicros(), nullptr);
  EXPECT_TRUE(st.ok()) << st.message();
  return JoinPath(root, CheckpointDirName(1));
}

// Every rank of (tensor, pipeline, data) fills its slices from `dir`: each bit-identical to
// ExtractShard of the original.
void ExpectLoadsAt(const FullModel& f, const std::string& dir, int tensor, int pipeline, int data) {
  SCOPED_TRACE(LayoutText(tensor, pipeline, data));
  CheckpointTensors ckpt;
  Status st = CheckpointTensors::Open(Env::Default(), dir, &ckpt);
  ASSERT_TRUE(st.ok()) << st.message();
  st = ckpt.CheckModel(f.spec, /*moments=*/true);
  ASSERT_TRUE(st.ok()) << st.message();
  for (const PieceCoords& c : AllRanks(tensor, pipeline, data)) {
    RankTensors got = LocalOf(f, c, /*cut=*/false);
    st = FillLocalTensors(ckpt, /*moments=*/true, got.list);
    ASSERT_TRUE(st.ok()) << st.message();
    const RankTensors want = LocalOf(f, c, /*cut=*/true);
    for (size_t i = 0; i < got.list.size(); ++i) {
      const std::string& name = got.list[i].name;
      ASSERT_EQ(got.w[i].size(), want.w[i].size());
      EXPECT_EQ(std::memcmp(got.w[i].data(), want.w[i].data(), got.w[i].size() * 4), 0)
          << name << " at tp " << c.tp << " pp " << c.pp;
      EXPECT_EQ(got.m[i], want.m[i]) << "exp_avg." << name << " at dp " << c.dp;
      EXPECT_EQ(got.v[i], want.v[i]) << "exp_avg_sq." << name << " at dp " << c.dp;
    }
  }
}

std::string TempRoot(const std::string& name) {
  return JoinPath(::testing::TempDir(), "keel_pieces_" + name + "_" + std::to_string(getpid()));
}

TEST(TensorPiecesTest, FileNamesCarryTheCoordinatesAndParseBack) {
  const PieceCoords c{1, 2, 0, 4, 3, 8};
  EXPECT_EQ(WeightsFileName(c), "model.tp-01-of-02.pp-000-of-004.safetensors");
  EXPECT_EQ(MomentsFileName(c), "optimizer.tp-01-of-02.pp-000-of-004.dp-003-of-008.safetensors");
  EXPECT_EQ(WeightsFileName({0, 1, 0, 1, 2, 4}), "model.safetensors");
  EXPECT_EQ(MomentsFileName({0, 1, 0, 1, 2, 4}), "optimizer.rank-002-of-004.safetensors");
  EXPECT_EQ(MomentsFileName({}), "optimizer.safetensors");
  bool moments = false;
  PieceCoords p;
  ASSERT_TRUE(ParsePieceFileName(MomentsFileName(c), &moments, &p));
  EXPECT_TRUE(moments);
  EXPECT_EQ(std::make_tuple(p.tp, p.tensor, p.pp, p.pipeline, p.dp, p.data),
            std::make_tuple(1, 2, 0, 4, 3, 8));
  ASSERT_TRUE(ParsePieceFileName(WeightsFileName(c), &moments, &p));
  EXPECT_FALSE(moments);
  EXPECT_FALSE(ParsePieceFileName("model.tp-02-of-02.pp-000-of-001.safetensors", &moments, &p));
  EXPECT_FALSE(ParsePieceFileName("state.json", &moments, &p));
}

// The issue's matrix: saved at (2, 2, 1) and at (2, 1, 2) with the moments sharded, loaded at
// (1, 1, 1), (1, 2, 2), (2, 1, 2) and (4, 1, 1), GPT-2 (tied embedding) and Llama (SwiGLU, GQA).
TEST(TensorPiecesTest, SavedAtOneLayoutLoadsBitIdenticalAtEveryOther) {
  for (const GptSpec& spec : {Gpt2Spec(), LlamaSpec()}) {
    const FullModel f = MakeFull(spec);
    for (const auto& [t, p, d] : {std::tuple{2, 2, 1}, std::tuple{2, 1, 2}}) {
      SCOPED_TRACE(std::string(spec.swiglu ? "llama" : "gpt2") + " saved at " +
                   LayoutText(t, p, d));
      const std::string dir = SaveAt(f, TempRoot("matrix"), t, p, d);
      CheckpointTensors ckpt;
      ASSERT_TRUE(CheckpointTensors::Open(Env::Default(), dir, &ckpt).ok());
      EXPECT_EQ(ckpt.layout(), LayoutText(t, p, d));
      for (const auto& [t2, p2, d2] :
           {std::tuple{1, 1, 1}, std::tuple{1, 2, 2}, std::tuple{2, 1, 2}, std::tuple{4, 1, 1}})
        ExpectLoadsAt(f, dir, t2, p2, d2);
      // Whole tensors too (the tools' view).
      std::vector<float> full;
      for (const ParamInfo& pi : f.params) {
        full.assign(pi.numel, 0);
        ASSERT_TRUE(ckpt.ReadFull(pi.name, full.data()).ok());
        EXPECT_EQ(std::memcmp(full.data(), f.w.data() + pi.offset, pi.numel * 4), 0) << pi.name;
        ASSERT_TRUE(ckpt.ReadFull("exp_avg_sq." + pi.name, full.data()).ok());
        EXPECT_EQ(std::memcmp(full.data(), f.v.data() + pi.offset, pi.numel * 4), 0) << pi.name;
      }
      EXPECT_EQ(ReshardNote(ckpt, {0, t, 0, p, 0, d}), "");
      EXPECT_NE(ReshardNote(ckpt, {0, 4, 0, 1, 0, 1}).find("re-cut from 2 to 4"),
                std::string::npos);
    }
  }
  Env::Default()->RemoveDirRecursive(TempRoot("matrix"));
}

// A single-process checkpoint (model.safetensors, optimizer.safetensors) is the (1, 1, 1) layout
// of the same format: it loads at T = 2 as well.
TEST(TensorPiecesTest, OneProcessCheckpointLoadsAtTensorParallelTwo) {
  const FullModel f = MakeFull(LlamaSpec());
  const std::string dir = SaveAt(f, TempRoot("one"), 1, 1, 1);
  EXPECT_TRUE(Env::Default()->FileExists(JoinPath(dir, "model.safetensors")));
  EXPECT_TRUE(Env::Default()->FileExists(JoinPath(dir, "optimizer.safetensors")));
  ExpectLoadsAt(f, dir, 2, 2, 1);
  Env::Default()->RemoveDirRecursive(TempRoot("one"));
}

std::string ErrorOfOpenAndFill(const FullModel& f, const std::string& dir) {
  CheckpointTensors ckpt;
  Status st = CheckpointTensors::Open(Env::Default(), dir, &ckpt);
  if (st.ok()) st = ckpt.CheckModel(f.spec, true);
  for (const PieceCoords& c : AllRanks(1, 1, 1)) {
    if (!st.ok()) break;
    RankTensors got = LocalOf(f, c, false);
    st = FillLocalTensors(ckpt, true, got.list);
  }
  return st.ok() ? "" : st.message();
}

TEST(TensorPiecesTest, DeletedOrFlippedPieceIsRefusedNamingTheFile) {
  const FullModel f = MakeFull(Gpt2Spec());
  const std::string root = TempRoot("damaged");
  const std::string piece = "model.tp-01-of-02.pp-001-of-002.safetensors";
  // Deleted (still listed in the manifest).
  std::string dir = SaveAt(f, root, 2, 2, 1);
  ASSERT_TRUE(Env::Default()->RemoveFile(JoinPath(dir, piece)).ok());
  std::string err = ErrorOfOpenAndFill(f, dir);
  EXPECT_NE(err.find(piece + " is missing"), std::string::npos) << err;
  // One byte of its data flipped: found when a rank reads from it, naming file and tensor.
  dir = SaveAt(f, root, 2, 2, 1);
  const std::string path = JoinPath(dir, piece);
  {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(0, std::ios::end);
    file.seekp(static_cast<std::streamoff>(file.tellg()) - 5);
    file.put('\x7f');
  }
  err = ErrorOfOpenAndFill(f, dir);
  EXPECT_NE(err.find(piece + ": xxh3 checksum"), std::string::npos) << err;
  EXPECT_NE(err.find("(reading layers."), std::string::npos) << err;
  // A rank of stage 0 at the saved layout never reads that file, so it loads.
  CheckpointTensors ckpt;
  ASSERT_TRUE(CheckpointTensors::Open(Env::Default(), dir, &ckpt).ok());
  RankTensors stage0 = LocalOf(f, {1, 2, 0, 2, 0, 1}, false);
  EXPECT_TRUE(FillLocalTensors(ckpt, true, stage0.list).ok());
  Env::Default()->RemoveDirRecursive(root);
}

TEST(TensorPiecesTest, PiecesThatDoNotTileAreRefusedNamingTheTensor) {
  const FullModel f = MakeFull(Gpt2Spec());
  const std::string dir = TempRoot("tiling");
  Env* env = Env::Default();
  env->RemoveDirRecursive(dir);
  // Rank 1 of 2 of layers.0.attention.dense.weight present twice (two files), rank 0 missing.
  CheckpointStore store(env, dir, nullptr);
  ASSERT_TRUE(store.BeginSave(1).ok());
  std::vector<ManifestEntry> entries;
  for (int pp = 0; pp < 2; ++pp) {
    RankTensors r = LocalOf(f, {1, 2, pp, 2, 0, 1}, true);
    std::vector<CheckpointFile> files;
    ASSERT_TRUE(BuildPieceFiles({1, 2, pp, 2, 0, 1}, r.list, false, &files).ok());
    if (pp == 1) {  // the same slice again, in the other stage's file
      RankTensors s0 = LocalOf(f, {1, 2, 0, 2, 0, 1}, true);
      std::vector<CheckpointFile> again;
      ASSERT_TRUE(BuildPieceFiles({1, 2, 1, 2, 0, 1}, s0.list, false, &again).ok());
      files = std::move(again);
      ASSERT_TRUE(store.WriteSaveFiles(1, files, &entries).ok());
      continue;
    }
    ASSERT_TRUE(store.WriteSaveFiles(1, files, &entries).ok());
  }
  for (int pp = 0; pp < 2; ++pp) {  // tensor rank 0's files, without layer 0's dense weight
    RankTensors r = LocalOf(f, {0, 2, pp, 2, 0, 1}, true);
    std::vector<LocalTensor> list;
    for (const LocalTensor& t : r.list)
      if (t.name != "layers.0.attention.dense.weight") list.push_back(t);
    std::vector<CheckpointFile> files;
    ASSERT_TRUE(BuildPieceFiles({0, 2, pp, 2, 0, 1}, list, false, &files).ok());
    ASSERT_TRUE(store.WriteSaveFiles(1, files, &entries).ok());
  }
  ASSERT_TRUE(store.CommitSave(1, entries, 0, nullptr).ok());
  CheckpointTensors ckpt;
  Status st = CheckpointTensors::Open(env, JoinPath(dir, CheckpointDirName(1)), &ckpt);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("the pieces of embedding.word_embeddings.weight do not tile it"),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("overlap what model.tp-01-of-02.pp-00"), std::string::npos)
      << st.message();
  env->RemoveDirRecursive(dir);
}

// The inputs of fuzz/regressions/tensor_pieces_fuzz: a piece's metadata was read with
// json::value, which throws on a field of another type (keel died with "terminate called ..."); a
// float "of" was cast to int (undefined); "of" of a billion ranks sized a vector of a billion
// lists (out of memory); a full shape whose size overflows int64 was multiplied out (undefined).
// Each is now Corruption.
TEST(TensorPiecesTest, MalformedPieceMetadataIsCorruptionNamingTheTensor) {
  const std::string root = TempRoot("metadata");
  Env* env = Env::Default();
  const std::vector<float> w = {1, 2, 3, 4};
  int64_t iteration = 0;
  for (const char* piece : {
           R"({"shape":[4],"split_dim":"x","parts":[],"rank":0,"of":1})",
           R"({"shape":[4],"split_dim":-1,"parts":[],"rank":0,"of":1e300})",
           R"({"shape":[4],"split_dim":-1,"parts":[],"rank":[0],"of":1})",
           R"({"shape":[4000000000],"split_dim":0,"parts":[4000000000],"rank":0,"of":1000000000})",
           R"({"shape":[4294967296,4294967296,4],"split_dim":-1,"parts":[],"rank":0,"of":1})",
           R"({"shape":[18446744073709551615],"split_dim":-1,"parts":[],"rank":0,"of":1})",
       }) {
    env->RemoveDirRecursive(root);
    CheckpointStore store(env, root, nullptr);
    ++iteration;
    ASSERT_TRUE(store.BeginSave(iteration).ok());
    std::vector<ManifestEntry> entries;
    const std::vector<CheckpointFile> files = {
        {"model.safetensors",
         "",
         true,
         {{"w", {4}, w.data()}},
         {{"keel.pieces", std::string(R"({"w":)") + piece + "}"}}}};
    ASSERT_TRUE(store.WriteSaveFiles(iteration, files, &entries).ok());
    ASSERT_TRUE(store.CommitSave(iteration, entries, 0, nullptr).ok());
    CheckpointTensors ckpt;
    const Status st =
        CheckpointTensors::Open(env, JoinPath(root, CheckpointDirName(iteration)), &ckpt);
    EXPECT_EQ(st.code(), Status::Code::kCorruption) << piece;
    EXPECT_NE(st.message().find("metadata 'keel.pieces' of tensor 'w' is malformed"),
              std::string::npos)
        << st.message();
  }
  env->RemoveDirRecursive(root);
}

}  // namespace
}  // namespace keel

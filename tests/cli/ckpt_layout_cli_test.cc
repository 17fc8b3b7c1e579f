// `keel ckpt verify / inspect / diff / export --hf` and a resume on a checkpoint saved at a
// tensor x pipeline parallel layout. No run saves one yet (the trainer's wiring comes later), so
// the test writes it: a one-process run's checkpoint re-saved at T=2 x P=2, every "rank" writing
// its pieces into one staging directory and rank 0 committing (checkpoint/tensor_pieces.h).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "checkpoint/checkpoint_store.h"
#include "checkpoint/tensor_pieces.h"
#include "checkpoint/train_checkpoint.h"
#include "keel_process.h"
#include "model/gpt.h"

namespace {

namespace fs = std::filesystem;
using keel::CheckpointTensors;
using keel::Env;
using keel::LocalTensor;
using keel::PieceCoords;
using keel::Status;
using keel_test::KeelResult;
using keel_test::RunKeelShell;

const char* const kTrain =
    "train --num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 32 "
    "--micro-batch-size 2 --lr-warmup-iters 2 --log-interval 1 --eval-iters 0 --sample-tokens 0 "
    "--save-interval 2 --keep-last-checkpoints 0 --threads 1 --train-iters 4 ";

// Re-saves checkpoint `src` (any layout) as the same iteration of run directory `root` at
// T x P (D = 1): the layers split evenly into stages, the embedding on the first, the final
// norm and the output layer on the last.
void Resave(const std::string& src, const std::string& root, int tensor, int pipeline) {
  Env* env = Env::Default();
  keel::SavedTrainState saved;
  ASSERT_TRUE(keel::ReadSavedTrainState(env, src, &saved).ok());
  CheckpointTensors ckpt;
  Status st = CheckpointTensors::Open(env, src, &ckpt);
  ASSERT_TRUE(st.ok()) << st.message();
  keel::Manifest manifest;
  ASSERT_TRUE(keel::ReadManifest(env, src, &manifest).ok());
  keel::CheckpointStore store(env, root, nullptr);
  ASSERT_TRUE(store.BeginSave(manifest.iteration).ok());
  std::vector<keel::ManifestEntry> entries;
  std::vector<std::vector<float>> buffers;
  buffers.reserve(1000);
  for (int pp = 0; pp < pipeline; ++pp)
    for (int tp = 0; tp < tensor; ++tp) {
      const PieceCoords c{tp, tensor, pp, pipeline, 0, 1};
      std::vector<LocalTensor> mine;
      for (const keel::ParamInfo& p : keel::GptModel::ParamLayout(saved.spec)) {
        int stage = p.name.rfind("embedding.", 0) == 0 ? 0 : pipeline - 1;
        if (p.name.rfind("layers.", 0) == 0)
          stage = std::stoi(p.name.substr(7)) / (saved.spec.num_layers / pipeline);
        if (stage != pp) continue;
        LocalTensor t;
        t.name = p.name;
        t.full_shape = p.shape;
        t.split = keel::TensorSplitOf(saved.spec, p.name, p.shape);
        t.tensor_rank = tp, t.tensor_size = tensor;
        const size_t n = t.slice_numel();
        for (float** dst : {&t.weights, &t.exp_avg, &t.exp_avg_sq}) {
          buffers.emplace_back(n);
          *dst = buffers.back().data();
        }
        t.moment_end = n;
        mine.push_back(t);
      }
      ASSERT_TRUE(keel::FillLocalTensors(ckpt, true, mine).ok());
      std::vector<keel::CheckpointFile> files;
      ASSERT_TRUE(keel::BuildPieceFiles(c, mine, true, &files).ok());
      if (tp == 0 && pp == 0)  // rank 0 also writes everything that is not a tensor
        for (const keel::ManifestEntry& e : manifest.files) {
          bool moments = false;
          PieceCoords ignored;
          if (keel::ParsePieceFileName(e.name, &moments, &ignored)) continue;
          keel::CheckpointFile f;
          f.name = e.name;
          ASSERT_TRUE(env->ReadFileToString(keel::JoinPath(src, e.name), &f.bytes).ok());
          files.push_back(std::move(f));
        }
      st = store.WriteSaveFiles(manifest.iteration, files, &entries);
      ASSERT_TRUE(st.ok()) << st.message();
    }
  st = store.CommitSave(manifest.iteration, entries, env->NowMicros(), nullptr);
  ASSERT_TRUE(st.ok()) << st.message();
}

void Flip(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(0, std::ios::end);
  f.seekp(static_cast<std::streamoff>(f.tellg()) - 3);
  f.put('\x55');
}

TEST(CkptLayoutCliTest, ToolsAndResumeReadACheckpointSavedAtTensorTwoPipelineTwo) {
  const std::string base = keel_test::FreshTempDir("ckpt_layout");
  const std::string run = base + "/run", tp = base + "/tp2pp2";
  KeelResult r = RunKeelShell("", std::string(kTrain) + "--save " + run);
  ASSERT_EQ(r.code, 0) << r.out;
  Resave(run + "/iter_0000002", tp, 2, 2);
  const std::string ckpt = tp + "/iter_0000002";
  ASSERT_TRUE(fs::exists(ckpt + "/model.tp-01-of-02.pp-001-of-002.safetensors"));
  ASSERT_TRUE(fs::exists(ckpt + "/optimizer.tp-00-of-02.pp-000-of-002.dp-000-of-001.safetensors"));
  ASSERT_FALSE(fs::exists(ckpt + "/model.safetensors"));

  r = RunKeelShell("", "ckpt verify " + ckpt);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("saved at T=2 x P=2 x D=1"), std::string::npos) << r.out;

  r = RunKeelShell("", "ckpt inspect " + ckpt + " model.layers.1.attention.dense.weight");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("model.layers.1.attention.dense.weight: F32 [32,32]"), std::string::npos)
      << r.out;
  r = RunKeelShell("", "ckpt inspect " + ckpt);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("layout: saved at T=2 x P=2 x D=1"), std::string::npos) << r.out;

  // The same tensors, whole, whatever the layout: diff finds nothing, export the same bytes.
  r = RunKeelShell("", "ckpt diff " + run + "/iter_0000002 " + ckpt);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("note: layout T=1 x P=1 x D=1 -> T=2 x P=2 x D=1"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("0 of 84 tensors differ"), std::string::npos) << r.out;
  r = RunKeelShell("", "ckpt diff " + run + "/iter_0000004 " + ckpt);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("tensor layers.1.attention.dense.weight: max |a-b|"), std::string::npos)
      << r.out;
  r = RunKeelShell("", "ckpt export " + ckpt + " --hf " + base + "/hf_tp");
  ASSERT_EQ(r.code, 0) << r.out;
  r = RunKeelShell("", "ckpt export " + run + "/iter_0000002 --hf " + base + "/hf_one");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(keel_test::ReadText(base + "/hf_tp/model.safetensors"),
            keel_test::ReadText(base + "/hf_one/model.safetensors"));

  // A one-process run resumes from it and continues bit for bit as the run that saved it.
  r = RunKeelShell("", std::string(kTrain) + "--save " + tp);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("resumed from"), std::string::npos) << r.out;
  // (Its state differs only where a resume's does: the save path, the guard's restart.)
  r = RunKeelShell("", "ckpt diff " + run + "/iter_0000004 " + tp + "/iter_0000004");
  EXPECT_NE(r.out.find("0 of 84 tensors differ"), std::string::npos) << r.out;

  // A damaged or missing piece is refused naming the file.
  const std::string piece = "model.tp-01-of-02.pp-001-of-002.safetensors";
  Flip(ckpt + "/" + piece);
  r = RunKeelShell("", "ckpt verify " + ckpt);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find(piece + ": xxh3 checksum"), std::string::npos) << r.out;
  fs::remove(ckpt + "/" + piece);
  r = RunKeelShell("", "ckpt verify " + ckpt);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find(piece + " is missing"), std::string::npos) << r.out;
  r = RunKeelShell("", "ckpt inspect " + ckpt);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find(piece + " is missing"), std::string::npos) << r.out;
  fs::remove_all(base);
}

}  // namespace

// A checkpoint saved from a model on the GPU restores on the CPU (the weights bit for bit, the
// rest of the run within tolerance) and on the GPU (the same fingerprint as a run that never
// stopped). Runs only in a KEEL_CUDA build, and skips where there is no GPU.
#ifdef KEEL_WITH_CUDA

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "../train/pattern_data.h"
#include "../train/test_loop.h"
#include "backend/cuda/cuda_backend.h"
#include "checkpoint/checkpoint_store.h"
#include "checkpoint/train_checkpoint.h"
#include "core/rng.h"
#include "train/checkpoint_controller.h"

namespace keel {
namespace {

namespace fs = std::filesystem;
using test_loop::TestLoop;

TrainConfig Tiny() {
  TrainConfig c;
  c.model.num_layers = 2;
  c.model.hidden = 32;
  c.model.heads = 4;
  c.seq_length = 16;
  c.micro_batch_size = 2;
  c.global_batch_size = 8;
  c.train_iters = 8;
  c.lr_warmup_iters = 2;
  c.lr = 3e-3;
  c.min_lr = 3e-4;
  c.model.vocab = 50;
  c.log_interval = 4;
  c.eval_interval = 100;
  c.eval_iters = 1;
  c.threads = 2;
  std::vector<std::string> notes;
  const Status st = Validate(&c, &notes);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return c;
}

// The learnable pattern stream of the trainer tests (tests/train/pattern_data.h).
using test_data::PatternData;

RunInfo NoTokenizer() {
  RunInfo r;
  r.meta.tokenizer = "none";
  return r;
}

struct Harness {
  std::unique_ptr<Backend> be;
  std::unique_ptr<Communicator> comm = MakeSingleProcessCommunicator();
  Trainer tr;
  Harness(const TrainConfig& c, std::unique_ptr<Backend> backend)
      : be(std::move(backend)), tr(c, be.get(), comm.get(), {PatternData(1), PatternData(2)}) {}
};

std::vector<float> Params(Harness& h) {
  std::vector<float> p(h.tr.model().num_params());
  h.be->CopyToHost(p.data(), h.tr.model().param_data(), p.size());
  return p;
}

class CudaCheckpointTest : public ::testing::TestWithParam<Precision> {
 protected:
  void SetUp() override {
    const Status st = CudaDeviceAvailable();
    if (!st.ok()) GTEST_SKIP() << "skipped, no GPU here: " << st.message();
  }
};

TEST_P(CudaCheckpointTest, SavedOnTheGpuResumesOnTheCpuAndOnTheGpu) {
  TrainConfig c = Tiny();
  c.precision = GetParam();
  auto cpu = [] { return MakeCpuBackend(2); };
  auto gpu = [&] {
    std::unique_ptr<Backend> b = MakeCudaBackend();
    b->SetPrecision(GetParam());
    return b;
  };
  // Uninterrupted, on the GPU.
  Harness a(c, gpu());
  a.tr.InitializeWeights();
  ASSERT_TRUE(TestLoop{&a.tr}.Run().ok());
  const uint64_t want = a.tr.StateFingerprint();
  const std::vector<float> want_params = Params(a);

  // Stopped at iteration 4 on the GPU and saved.
  const std::string root = ::testing::TempDir() + "/keel_cuda_ckpt_" + std::to_string(getpid());
  fs::remove_all(root);
  std::vector<float> saved_params;
  {
    Harness b(c, gpu());
    b.tr.InitializeWeights();
    CheckpointStore store(Env::Default(), root, nullptr);
    CheckpointController ctl(c, Env::Default(), &store, &b.tr, NoTokenizer(),
                             nlohmann::json::array(), nullptr);
    TestLoop loop{&b.tr};
    loop.go_on = [&] { return b.tr.state().counters.iteration < 4; };
    ASSERT_TRUE(loop.Run().ok());
    ASSERT_TRUE(ctl.SaveNow("test").ok());
    saved_params = Params(b);
  }
  CheckpointStore store(Env::Default(), root, nullptr);
  CheckpointInfo info;
  ASSERT_TRUE(store.FindNewestValid(true, &info).ok());
  SavedTrainState saved;
  ASSERT_TRUE(ReadSavedTrainState(Env::Default(), info.path, &saved).ok());

  // On the GPU again: bit-exact with the uninterrupted run.
  {
    Harness r(c, gpu());
    ASSERT_TRUE(RestoreTrainer(Env::Default(), saved, &r.tr).ok());
    ASSERT_TRUE(TestLoop{&r.tr}.Run().ok());
    EXPECT_EQ(r.tr.StateFingerprint(), want);
  }
  // On the CPU: the weights as saved, bit for bit; the rest of the run within tolerance of the
  // GPU's (other summation orders, fp32 or bf16 products).
  Harness r(c, cpu());
  ASSERT_TRUE(RestoreTrainer(Env::Default(), saved, &r.tr).ok());
  EXPECT_EQ(Params(r), saved_params);
  ASSERT_TRUE(TestLoop{&r.tr}.Run().ok());
  const std::vector<float> got = Params(r);
  ASSERT_EQ(got.size(), want_params.size());
  double err = 0, ref = 0;
  for (size_t i = 0; i < got.size(); i++) {
    err += (double(got[i]) - want_params[i]) * (double(got[i]) - want_params[i]);
    ref += double(want_params[i]) * want_params[i];
  }
  const double tol = GetParam() == Precision::kFp32 ? 1e-4 : 2e-2;
  EXPECT_LT(std::sqrt(err / ref), tol) << "relative L2 distance of the final weights";
  fs::remove_all(root);
}

INSTANTIATE_TEST_SUITE_P(Precisions, CudaCheckpointTest,
                         ::testing::Values(Precision::kFp32, Precision::kBf16),
                         [](const auto& info) { return std::string(PrecisionName(info.param)); });

}  // namespace
}  // namespace keel

#endif  // KEEL_WITH_CUDA

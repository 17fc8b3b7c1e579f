// The trainer in bf16 and fp16: both learn like fp32, fp16's loss scaler follows Megatron's rules
// on injected overflows (update skipped, scale lowered after the hysteresis, grown back after a
// clean window), and an overflow never reaches the weights.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/rng.h"
#include "pattern_data.h"
#include "test_loop.h"
#include "train/trainer.h"

namespace keel {
namespace {

TrainConfig TinyConfig(Precision p) {
  TrainConfig c;
  c.model.num_layers = 2;
  c.model.hidden = 32;
  c.model.heads = 4;
  c.seq_length = 16;
  c.micro_batch_size = 2;
  c.global_batch_size = 4;
  c.train_iters = 60;
  c.lr = 1e-2;
  c.min_lr = 1e-3;
  c.lr_warmup_iters = 5;
  c.model.vocab = 50;
  c.threads = 2;
  c.precision = p;
  c.initial_loss_scale = 1024;
  c.loss_scale_window = 4;
  c.hysteresis = 2;
  std::vector<std::string> notes;
  Status st = Validate(&c, &notes);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return c;
}

using test_data::PatternData;

std::vector<double> Losses(Precision p, int iters) {
  auto be = MakeCpuBackend(2);
  auto comm = MakeSingleProcessCommunicator();
  Trainer tr(TinyConfig(p), be.get(), comm.get(), {PatternData(1), SampleFn()});
  tr.InitializeWeights();
  std::vector<double> losses;
  for (int i = 0; i < iters; ++i) losses.push_back(tr.TrainStep().loss);
  // fp16's scale doubles after every 4 clean iterations here (window 4), so it climbs until a
  // gradient overflows, backs off, and climbs again: a few skipped updates are the design.
  const int64_t skipped = tr.state().counters.skipped_iterations;
  if (p == Precision::kFp16) {
    EXPECT_LT(skipped, 10);
  } else {
    EXPECT_EQ(skipped, 0) << PrecisionName(p);
  }
  return losses;
}

// Both recipes follow fp32's curve: the same first loss to within the products' rounding, and
// after 60 updates the same loss to a few percent. (Were bf16's compute copy of the weights
// never refreshed after the updates, its loss would stay near the first one.)
TEST(MixedPrecisionTest, Bf16AndFp16LearnLikeFp32) {
  const std::vector<double> fp32 = Losses(Precision::kFp32, 60);
  ASSERT_LT(fp32.back(), 0.6 * fp32.front());
  for (Precision p : {Precision::kBf16, Precision::kFp16}) {
    SCOPED_TRACE(PrecisionName(p));
    const std::vector<double> l = Losses(p, 60);
    EXPECT_NEAR(l.front(), fp32.front(), 0.01 * fp32.front());
    EXPECT_NE(l.front(), fp32.front());  // the products really are rounded
    EXPECT_NEAR(l.back(), fp32.back(), 0.05 * fp32.back());
  }
}

// Megatron's DynamicGradScaler with hysteresis 2 and window 4, overflows injected at iterations
// 3, 4 and 6:
//   it 1, 2  clean: scale 1024
//   it 3     overflow: skipped; hysteresis 2 -> 1 absorbs it, scale 1024
//   it 4     overflow: skipped; hysteresis 1 -> 0, scale 512
//   it 5     clean
//   it 6     overflow: skipped; hysteresis stays spent (only growth resets it), scale 256
//   it 7-10  clean: the 4th clean iteration in a row doubles it, 512 (hysteresis back to 2)
//   it 11    overflow: absorbed again by the restored hysteresis, scale 512
TEST(MixedPrecisionTest, Fp16LossScalerFollowsMegatronOnInjectedOverflows) {
  auto be = MakeCpuBackend(2);
  auto comm = MakeSingleProcessCommunicator();
  Trainer tr(TinyConfig(Precision::kFp16), be.get(), comm.get(), {PatternData(1), SampleFn()});
  tr.InitializeWeights();
  ASSERT_NE(tr.loss_scaler(), nullptr);
  const std::vector<int64_t> overflow_at = {3, 4, 6, 11};
  test_loop::FunctionFaults faults([&](int64_t it, float* g, size_t) {
    for (int64_t o : overflow_at)
      if (o == it) {
        const float inf = INFINITY;
        be->CopyToDevice(g + 7, &inf, 1);
      }
  });
  tr.set_faults(&faults);
  const std::vector<double> want_scale = {1024, 1024, 1024, 512, 512, 256, 256, 256, 256, 512, 512};
  const std::vector<LossScaleChange> want_change = {LossScaleChange::kNone,
                                                    LossScaleChange::kNone,
                                                    LossScaleChange::kOverflowCounted,
                                                    LossScaleChange::kBackedOff,
                                                    LossScaleChange::kNone,
                                                    LossScaleChange::kBackedOff,
                                                    LossScaleChange::kNone,
                                                    LossScaleChange::kNone,
                                                    LossScaleChange::kNone,
                                                    LossScaleChange::kGrew,
                                                    LossScaleChange::kOverflowCounted};
  std::vector<float> before(tr.model().num_params()), after(before.size());
  double prev_lr = 0;
  for (int it = 1; it <= 11; ++it) {
    SCOPED_TRACE(it);
    be->CopyToHost(before.data(), tr.model().param_data(), before.size());
    const int64_t step = tr.optimizer().step();
    const StepResult r = tr.TrainStep();
    const bool overflow =
        std::find(overflow_at.begin(), overflow_at.end(), it) != overflow_at.end();
    EXPECT_EQ(r.overflow, overflow);
    EXPECT_EQ(r.skipped, overflow);
    EXPECT_EQ(r.loss_scale, want_scale[it - 1]);
    EXPECT_EQ(r.loss_scale_change, want_change[it - 1]);
    EXPECT_TRUE(std::isfinite(r.loss));
    // Megatron steps the LR scheduler only after a successful update: the iteration after an
    // overflow runs at the LR the overflowed one had (warm-up: the LR rises every update).
    if (it > 1 && std::find(overflow_at.begin(), overflow_at.end(), it - 1) != overflow_at.end()) {
      EXPECT_EQ(r.lr, prev_lr);
    } else if (it > 1 && it <= 5) {
      EXPECT_GT(r.lr, prev_lr);
    }
    prev_lr = r.lr;
    be->CopyToHost(after.data(), tr.model().param_data(), after.size());
    if (overflow) {
      EXPECT_EQ(before, after) << "an overflowed iteration changed the weights";
      EXPECT_EQ(tr.optimizer().step(), step);
    } else {
      EXPECT_TRUE(std::isfinite(r.grad_norm));
      EXPECT_EQ(tr.optimizer().step(), step + 1);
    }
  }
  EXPECT_EQ(tr.state().counters.skipped_iterations, 4);
  EXPECT_EQ(tr.state().counters.nan_iterations, 0);  // overflows are not NaN iterations
  EXPECT_EQ(tr.state().loss_scaler.scale, 512);
  EXPECT_EQ(tr.state().loss_scaler.hysteresis_tracker, 1);
  EXPECT_EQ(tr.state().loss_scaler.skipped_samples, 4 * 4);  // 4 overflows x 4 sequences
}

// The gradient the update sees is unscaled: fp16's grad norm is fp32's to within rounding, not
// the loss scale times it.
TEST(MixedPrecisionTest, Fp16GradNormIsUnscaled) {
  auto run = [](Precision p) {
    auto be = MakeCpuBackend(2);
    auto comm = MakeSingleProcessCommunicator();
    Trainer tr(TinyConfig(p), be.get(), comm.get(), {PatternData(1), SampleFn()});
    tr.InitializeWeights();
    return tr.TrainStep().grad_norm;
  };
  const double fp32 = run(Precision::kFp32), fp16 = run(Precision::kFp16);
  EXPECT_NEAR(fp16, fp32, 0.02 * fp32);
}

// A checkpoint's scaler state restored: the resumed trainer continues with the same scale and
// trackers, so the run goes on bit for bit.
TEST(MixedPrecisionTest, Fp16RestoreCarriesTheScaler) {
  auto be = MakeCpuBackend(2);
  auto comm = MakeSingleProcessCommunicator();
  const TrainConfig c = TinyConfig(Precision::kFp16);
  Trainer a(c, be.get(), comm.get(), {PatternData(1), SampleFn()});
  a.InitializeWeights();
  test_loop::FunctionFaults faults([&](int64_t it, float* g, size_t) {
    if (it == 2 || it == 3) {
      const float inf = INFINITY;
      be->CopyToDevice(g, &inf, 1);
    }
  });
  a.set_faults(&faults);
  for (int i = 0; i < 4; ++i) a.TrainStep();
  ASSERT_EQ(a.state().loss_scaler.scale, 512);
  Trainer b(c, be.get(), comm.get(), {PatternData(1), SampleFn()});
  b.Restore(a.state());
  EXPECT_EQ(b.loss_scaler()->scale(), 512);
  EXPECT_EQ(b.loss_scaler()->state().growth_tracker, a.loss_scaler()->state().growth_tracker);
  b.ResetLossScaler();  // a checkpoint from another precision: afresh from the config
  EXPECT_EQ(b.loss_scaler()->scale(), 1024);
  EXPECT_EQ(b.state().loss_scaler.scale, 1024);
}

}  // namespace
}  // namespace keel

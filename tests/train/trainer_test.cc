#include "train/trainer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>

#include "core/rng.h"
#include "metrics/run_metrics.h"
#include "pattern_data.h"
#include "test_loop.h"
#include "train/iteration_log.h"

namespace keel {
namespace {

using test_loop::CapturedLog;
using test_loop::TestLoop;

TrainConfig TinyConfig() {
  TrainConfig c;
  c.model.num_layers = 2;
  c.model.hidden = 32;
  c.model.heads = 4;
  c.seq_length = 16;
  c.micro_batch_size = 2;
  c.global_batch_size = 4;  // two micro-batches: exercises gradient accumulation
  c.train_iters = 40;
  c.lr = 3e-3;
  c.min_lr = 3e-4;
  c.lr_warmup_iters = 5;
  c.model.vocab = 50;
  c.log_interval = 10;
  c.eval_interval = 20;
  c.eval_iters = 2;
  c.threads = 2;
  std::vector<std::string> notes;
  Status st = Validate(&c, &notes);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return c;
}

using test_data::PatternData;

TEST(TrainerTest, LossFallsOnLearnableData) {
  TrainConfig c = TinyConfig();
  c.train_iters = 100;
  c.lr = 1e-2;
  c.min_lr = 1e-3;
  std::vector<std::string> notes;
  ASSERT_TRUE(Validate(&c, &notes).ok());
  auto be = MakeCpuBackend(2);
  auto comm = MakeSingleProcessCommunicator();
  Trainer tr(c, be.get(), comm.get(), {PatternData(1), PatternData(2)});
  tr.InitializeWeights();
  const double first = tr.TrainStep().loss;
  EXPECT_NEAR(first, std::log(50.0), 0.3);  // near-uniform prediction at init
  double last = 0;
  for (int i = 1; i < 100; ++i) last = tr.TrainStep().loss;
  // Measured 3.92 -> 1.65: the bigram rule is being learned (unigram entropy is ~3.9).
  EXPECT_LT(last, 0.6 * first);
  EXPECT_LT(tr.Evaluate(2), 0.6 * first);
  EXPECT_EQ(tr.state().counters.iteration, 100);
  EXPECT_EQ(tr.state().counters.consumed_samples, 400);
  EXPECT_EQ(tr.state().counters.consumed_tokens, 400 * 16);
  EXPECT_EQ(tr.optimizer().step(), 100);
}

TEST(TrainerTest, SameConfigSameBitsDifferentSeedDifferentBits) {
  TrainConfig c = TinyConfig();
  auto be = MakeCpuBackend(2);
  auto comm = MakeSingleProcessCommunicator();
  auto run = [&](uint64_t seed) {
    TrainConfig cc = c;
    cc.seed = seed;
    Trainer tr(cc, be.get(), comm.get(), {PatternData(1), SampleFn()});
    tr.InitializeWeights();
    std::vector<double> losses;
    // One whole log interval: the fingerprint of one in progress includes its wall time.
    for (int i = 0; i < c.log_interval; ++i) losses.push_back(tr.TrainStep().loss);
    return std::make_pair(tr.StateFingerprint(), losses);
  };
  auto a = run(1234), b = run(1234), d = run(99);
  EXPECT_EQ(a.first, b.first);
  EXPECT_EQ(a.second, b.second);  // bit-identical losses
  EXPECT_NE(a.first, d.first);
}

TEST(TrainerTest, NonFiniteGradientsSkipTheUpdateAndAreCounted) {
  TrainConfig c = TinyConfig();
  auto be = MakeCpuBackend(2);
  auto comm = MakeSingleProcessCommunicator();
  Trainer tr(c, be.get(), comm.get(), {PatternData(1), SampleFn()});
  tr.InitializeWeights();
  tr.TrainStep();
  // Poison one weight: the forward produces NaN, the update must be skipped.
  std::vector<float> w(tr.model().num_params());
  be->CopyToHost(w.data(), tr.model().param_data(), w.size());
  const ParamInfo* p = tr.model().FindParam("layers.0.mlp.dense_h_to_4h.weight");
  w[p->offset] = NAN;
  be->CopyToDevice(tr.model().mutable_param_data(), w.data(), w.size());
  const int64_t step_before = tr.optimizer().step();
  StepResult r = tr.TrainStep();
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(tr.optimizer().step(), step_before);
  EXPECT_EQ(tr.state().counters.skipped_iterations, 1);
  EXPECT_EQ(tr.state().counters.nan_iterations, 1);
  std::vector<float> after(w.size());
  be->CopyToHost(after.data(), tr.model().param_data(), after.size());
  for (size_t i = 0; i < w.size(); ++i) {
    if (i == p->offset) continue;
    ASSERT_EQ(after[i], w[i]) << "weight " << i << " changed by a skipped step";
  }
}

TEST(TrainerTest, RunLogsMegatronLinesAndValidation) {
  TrainConfig c = TinyConfig();
  c.train_iters = 20;
  c.guard = GuardLevel::kOff;  // no guard signals line
  std::vector<std::string> notes;
  ASSERT_TRUE(Validate(&c, &notes).ok());
  auto be = MakeCpuBackend(2);
  auto comm = MakeSingleProcessCommunicator();
  Trainer tr(c, be.get(), comm.get(), {PatternData(1), PatternData(2)});
  tr.InitializeWeights();
  CapturedLog log;
  ASSERT_TRUE(TestLoop{&tr}.Run().ok());
  const std::vector<std::string>& lines = log.lines;
  ASSERT_EQ(lines.size(), 3u);  // iterations 10 and 20, validation at 20
  const std::regex iter_re(
      R"( iteration +20/ +20 \| consumed samples: +80 \| consumed tokens: +1280 \| elapsed time per iteration \(ms\): [0-9.]+ \| learning rate: [0-9.]+E[-+][0-9]+ \| global batch size: +4 \| lm loss: [0-9.]+E[-+][0-9]+ \| loss scale: 1\.0 \| grad norm: [0-9.]+ \| num zeros: [0-9.]+ \| number of skipped iterations: +0 \| number of nan iterations: +0 \| samples per second: [0-9.]+ \| TFLOPs: [0-9.]+ \|)");
  EXPECT_TRUE(std::regex_match(lines[1], iter_re)) << lines[1];
  EXPECT_TRUE(std::regex_match(
      lines[2],
      std::regex(
          R"( validation loss at iteration 20 \| lm loss value: [0-9.]+E[-+][0-9]+ \| lm loss PPL: [0-9.]+E[-+][0-9]+ \|)")))
      << lines[2];
}

TEST(TrainerTest, SkippedDataWindowIsAGapNotANan) {
  TrainConfig c = TinyConfig();
  c.train_iters = 30;
  c.eval_iters = 0;
  c.skip_train_iteration_range = {"11-20"};  // the whole second log interval
  std::vector<std::string> notes;
  ASSERT_TRUE(Validate(&c, &notes).ok());
  auto be = MakeCpuBackend(2);
  auto comm = MakeSingleProcessCommunicator();
  Trainer tr(c, be.get(), comm.get(), {PatternData(1), SampleFn()});
  tr.InitializeWeights();
  const std::string dir = ::testing::TempDir() + "/keel_skip_window_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::unique_ptr<RunMetrics> metrics;
  ASSERT_TRUE(RunMetrics::Open(Env::Default(), dir, &metrics).ok());
  CapturedLog log;
  TestLoop loop{&tr};
  loop.metrics = metrics.get();
  ASSERT_TRUE(loop.Run().ok());
  const std::vector<std::string>& lines = log.lines;
  std::vector<nlohmann::json> records;
  std::string text;
  ASSERT_TRUE(Env::Default()->ReadFileToString(dir + "/metrics.jsonl", &text).ok());
  for (size_t at = 0, nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1)
    records.push_back(nlohmann::json::parse(text.substr(at, nl - at)));
  std::filesystem::remove_all(dir);
  std::string skipped_line;
  for (const std::string& l : lines)
    if (l.find(" iteration       20/") == 0) skipped_line = l;
  ASSERT_FALSE(skipped_line.empty());
  EXPECT_NE(skipped_line.find("number of skipped iterations:  10 | number of nan iterations:   0"),
            std::string::npos)
      << skipped_line;
  EXPECT_EQ(skipped_line.find("lm loss"), std::string::npos) << skipped_line;
  EXPECT_EQ(skipped_line.find("samples per second"), std::string::npos) << skipped_line;
  EXPECT_EQ(skipped_line.find("TFLOPs"), std::string::npos) << skipped_line;
  const nlohmann::json& r15 = records.at(14);
  EXPECT_EQ(r15["iteration"], 15);
  EXPECT_TRUE(r15["data_skipped"].get<bool>());
  EXPECT_FALSE(r15["nan"].get<bool>());
  EXPECT_TRUE(r15["lm_loss"].is_null());
  EXPECT_TRUE(r15["samples_per_second"].is_null());
  EXPECT_TRUE(r15["tflops"].is_null());
  EXPECT_EQ(tr.state().counters.data_skipped_iterations, 10);
  EXPECT_EQ(tr.state().counters.nan_iterations, 0);
  EXPECT_EQ(tr.state().optimizer_step, 20);
}

// Samples from the pattern, recording which were read; sample `fail_at` is refused.
class RecordingSource : public SampleSource {
 public:
  explicit RecordingSource(int64_t fail_at = -1) : fail_at_(fail_at) {}
  Status ReadTrain(const SampleRequest& r, int32_t* tokens, int* dataset) override {
    if (r.index == fail_at_)
      return Status::InvalidArgument("sample " + std::to_string(r.index) + " is bad");
    read.push_back(r.index);
    *dataset = pattern_(r.index, tokens);
    return Status::OK();
  }
  Status ReadValid(int, const SampleRequest&, int32_t*) override {
    return Status::Internal("no validation");
  }
  std::vector<int64_t> read;

 private:
  int64_t fail_at_;
  SampleFn pattern_ = PatternData(1);
};

// Micro-batch m of rank r reads samples (m * dp + r) * mbs + b after the consumed ones:
// Megatron's order, which resumes on any number of ranks.
TEST(TrainerTest, MicroBatchScheduleIsMegatronsSampleOrder) {
  const MicroBatchSchedule s{8, 2, 2, 2, 1};  // from sample 8, mbs 2, 2 micro-batches, rank 1 of 2
  EXPECT_EQ(s.SampleIndex(0, 0), 10);
  EXPECT_EQ(s.SampleIndex(0, 1), 11);
  EXPECT_EQ(s.SampleIndex(1, 0), 14);
  EXPECT_EQ(s.SampleIndex(1, 1), 15);

  TrainConfig c = TinyConfig();  // global batch 4 = 2 micro-batches of 2 on one rank
  auto be = MakeCpuBackend(2);
  auto comm = MakeSingleProcessCommunicator();
  auto source = std::make_shared<RecordingSource>();
  TrainerData data;
  data.samples = source;
  Trainer tr(c, be.get(), comm.get(), data);
  tr.InitializeWeights();
  tr.TrainStep();
  const IterationPlan plan = tr.PlanIteration();
  EXPECT_EQ(plan.iteration, 2);
  EXPECT_EQ(plan.schedule.first_sample, 4);
  EXPECT_EQ(plan.schedule.micro_batches, 2);
  StepResult r;
  ASSERT_TRUE(tr.ComputeGradients(plan, &r).ok());
  EXPECT_EQ(source->read, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
}

// A sample the source refuses ends the iteration with its Status before any update: the state
// (weights, moments, counters) is the last completed iteration's.
TEST(TrainerTest, ARefusedSampleIsAStatusAndChangesNoState) {
  TrainConfig c = TinyConfig();
  c.log_interval = 1;  // no interval in progress: the fingerprint holds no wall time
  auto be = MakeCpuBackend(2);
  auto comm = MakeSingleProcessCommunicator();
  TrainerData data;
  data.samples = std::make_shared<RecordingSource>(/*fail_at=*/6);  // iteration 2's third
  Trainer tr(c, be.get(), comm.get(), data);
  tr.InitializeWeights();
  tr.TrainStep();
  const uint64_t before = tr.StateFingerprint();
  const IterationPlan plan = tr.PlanIteration();
  StepResult r;
  const Status st = tr.ComputeGradients(plan, &r);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(st.message(), "sample 6 is bad");
  EXPECT_EQ(tr.state().counters.iteration, 1);
  EXPECT_EQ(tr.state().optimizer_step, 1);
  EXPECT_EQ(tr.StateFingerprint(), before);
}

TEST(TrainerTest, StateRestoreCarriesEveryFieldIntoTheFingerprint) {
  TrainConfig c = TinyConfig();
  auto be = MakeCpuBackend(2);
  auto comm = MakeSingleProcessCommunicator();
  Trainer tr(c, be.get(), comm.get(), {PatternData(1), SampleFn()});
  tr.InitializeWeights();
  tr.TrainStep();
  const uint64_t base = tr.StateFingerprint();
  const TrainState s0 = tr.state();
  std::vector<std::function<void(TrainState&)>> edits = {
      [](TrainState& s) { s.counters.consumed_samples += 1; },
      [](TrainState& s) { s.optimizer_step += 1; },
      [](TrainState& s) { s.lr_scale = 0.5; },
      [](TrainState& s) {
        s.skip_ranges.push_back({5, 6});
      },
      [](TrainState& s) { s.data_salt = 1; },
      [](TrainState& s) { s.interval.iters += 1; },
  };
  for (size_t i = 0; i < edits.size(); ++i) {
    TrainState s = s0;
    edits[i](s);
    tr.Restore(s);
    EXPECT_NE(tr.StateFingerprint(), base) << "edit " << i << " is not in the fingerprint";
    tr.Restore(s0);
    EXPECT_EQ(tr.StateFingerprint(), base);
  }
  // Restore also sets the optimizer's own step (its bias correction).
  TrainState s = s0;
  s.optimizer_step = 7;
  tr.Restore(s);
  EXPECT_EQ(tr.optimizer().step(), 7);
}

TEST(IterationLogTest, MatchesTheSeedsLineLayout) {
  IterationStats s;
  s.iteration = 7000;
  s.train_iters = 159576;
  s.consumed_samples = 260912;
  s.consumed_tokens = 534347776;
  s.elapsed_ms_per_iter = 18706.1;
  s.learning_rate = 6e-5;
  s.global_batch_size = 96;
  s.lm_loss = 6.444662;
  s.loss_scale = 2048;
  s.grad_norm = 98258.265;
  s.samples_per_second = 5.132;
  s.tflops = 149.02;
  EXPECT_EQ(FormatIterationLine(s),
            " iteration     7000/  159576 | consumed samples:       260912 | consumed tokens:    "
            "534347776 | elapsed time per iteration (ms): 18706.1 | learning rate: 6.000E-05 | "
            "global batch size:    96 | lm loss: 6.444662E+00 | loss scale: 2048.0 | grad norm: "
            "98258.265 | num zeros: 0.0 | number of skipped iterations:   0 | number of nan "
            "iterations:   0 | samples per second: 5.132 | TFLOPs: 149.02 |");
  EXPECT_EQ(FormatValidationLine(7000, 7.1742),
            " validation loss at iteration 7000 | lm loss value: 7.174200E+00 | lm loss PPL: "
            "1.305315E+03 |");
}

}  // namespace
}  // namespace keel

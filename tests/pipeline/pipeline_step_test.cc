// Pipeline stages of the GPT model (model/gpt.h's ModelStage) run by RunPipelineStep
// (pipeline/pipeline_step.h) on ranks as threads (MakeThreadGroup, a ProcessMesh over it): at
// P = 2 and 4 (1F1B), P = 2 with two interleaved chunks, and tensor 2 x pipeline 2, the stages are
// the one-process model cut in layers: the same initial values bit for bit, the same losses and
// gradients (every parameter, by name) within fp32 tolerance, both copies of a tied embedding the
// same bits after AdamW steps, each layout the same bits run after run, and exactly b s h floats
// sent per micro-batch per boundary.
#include "pipeline/pipeline_step.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "comm/process_mesh.h"
#include "core/rng.h"
#include "model/gpt.h"
#include "model/tensor_split.h"
#include "pipeline/schedule.h"
#include "pipeline/stage_partition.h"

namespace keel {
namespace {

constexpr uint64_t kSeed = 4321;
constexpr int kBatch = 2, kSeq = 8, kMicro = 4;
constexpr char kWte[] = "embedding.word_embeddings.weight";

// GPT-2's shape (learned positions, LayerNorm, GELU, biases, tied output layer), 4 layers.
GptSpec Gpt2Spec() {
  GptSpec s;
  s.num_layers = 4;
  s.hidden = 32;
  s.heads = 4;
  s.ffn_hidden = 128;
  s.max_positions = 16;
  s.vocab = 61;
  s.padded_vocab = 64;
  return s;
}

// Llama's: RoPE, RMSNorm, SwiGLU, GQA (4 key/value groups for 8 heads), no biases, untied.
GptSpec LlamaSpec() {
  GptSpec s;
  s.num_layers = 4;
  s.hidden = 64;
  s.heads = 8;
  s.SetKvHeads(4);
  s.ffn_hidden = 96;
  s.max_positions = 16;
  s.vocab = 61;
  s.padded_vocab = 64;
  s.rope = true;
  s.rmsnorm = true;
  s.swiglu = true;
  s.bias = false;
  s.untie_embeddings = true;
  return s;
}

std::vector<int32_t> Tokens(int step, int micro, int salt, int vocab) {
  std::vector<int32_t> t(kBatch * kSeq);
  const RngKey key{kSeed + 5, RngPurpose::kInit,
                   static_cast<uint64_t>(step * 100 + micro * 10 + salt)};
  for (size_t i = 0; i < t.size(); ++i)
    t[i] = static_cast<int32_t>(std::fabs(NormalAt(key, i)) * 1e4) % vocab;
  return t;
}

void AdamW(Backend* be, GptModel* m, float* mom, float* var, int step) {
  be->AdamWUpdate(m->mutable_param_data(), m->grad_data(), mom, var, m->num_params(), 3e-3f, 0.9f,
                  0.95f, 1e-8f, 0.1f, step);
}

std::vector<float> HostCopy(GptModel& m, const float* base, const ParamInfo& p) {
  std::vector<float> v(p.numel);
  m.backend()->CopyToHost(v.data(), base + p.offset, p.numel);
  return v;
}

// What a run leaves: per step the mean loss, the first step's gradients and the final weights,
// per parameter name, whole (gathered from tensor slices).
struct RunResult {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> grads, weights;
  // Per pipeline rank: the sizes (floats) of the messages it sent in the first step.
  std::map<int, std::vector<size_t>> sent;
  bool tied_copies_equal = true;  // both copies of a tied embedding: same gradient, same weights
};

RunResult OneProcess(const GptSpec& spec, int steps, Precision precision = Precision::kFp32) {
  RunResult out;
  auto be = MakeCpuBackend(1);
  be->SetPrecision(precision);
  GptModel m(be.get(), spec);
  m.Initialize(kSeed, 0.02f);
  float* mom = be->AllocFloats(m.num_params());
  float* var = be->AllocFloats(m.num_params());
  for (int s = 0; s < steps; ++s) {
    m.StartGradAccumulation();
    double loss = 0;
    for (int k = 0; k < kMicro; ++k) {
      const auto in = Tokens(s, k, 0, spec.vocab), tg = Tokens(s, k, 1, spec.vocab);
      loss += m.Forward(in.data(), tg.data(), kBatch, kSeq, 1.0f / (kBatch * kSeq * kMicro));
      m.Backward();
    }
    out.losses.push_back(loss / kMicro);
    if (s == 0) {
      for (const ParamInfo& p : m.params()) out.grads[p.name] = HostCopy(m, m.grad_data(), p);
    }
    AdamW(be.get(), &m, mom, var, s + 1);
  }
  for (const ParamInfo& p : m.params()) out.weights[p.name] = HostCopy(m, m.param_data(), p);
  be->Free(mom);
  be->Free(var);
  return out;
}

// Counts the sizes of the point-to-point messages a rank sends; everything else passes through.
class CountingCommunicator : public Communicator {
 public:
  explicit CountingCommunicator(Communicator* inner) : inner_(inner) {}
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string Describe() const override { return inner_->Describe(); }
  void ReduceScatterSum(float* d, size_t n, size_t b, size_t e) override {
    inner_->ReduceScatterSum(d, n, b, e);
  }
  void AllGather(float* d, size_t n) override { inner_->AllGather(d, n); }
  void AllGatherBytes(const std::string& mine, std::vector<std::string>* all) override {
    inner_->AllGatherBytes(mine, all);
  }
  void Barrier() override { inner_->Barrier(); }
  void Send(const float* data, size_t n, int peer) override {
    sent.push_back(n);
    inner_->Send(data, n, peer);
  }
  void Recv(float* data, size_t n, int peer) override { inner_->Recv(data, n, peer); }
  std::unique_ptr<Communicator> Split(int color, int key) override {
    return inner_->Split(color, key);
  }
  [[noreturn]] void Abort(int code) override {
    inner_->Abort(code);
    std::abort();  // not reached: the compiler does not see through the virtual call
  }
  std::vector<size_t> sent;

 private:
  Communicator* inner_;
};

struct Layout {
  int tensor = 1, pipeline = 1, chunks = 1;
  Recompute recompute = Recompute::kNone;
  Precision precision = Precision::kFp32;
  bool sequence_parallel = false;
};

RunResult Pipelined(const GptSpec& spec, const Layout& lay, int steps) {
  const int world = lay.tensor * lay.pipeline;
  auto comms = MakeThreadGroup(world);
  std::mutex mu;
  RunResult out;
  // Per (name, tensor rank): the slices, and which pipeline ranks gave them.
  std::map<std::string, std::map<int, std::vector<float>>> grad_slices, weight_slices;
  std::map<std::string, ParamInfo> infos;
  std::vector<std::vector<double>> losses(world);
  std::vector<std::thread> threads;
  for (int w = 0; w < world; ++w) {
    threads.emplace_back([&, w] {
      std::unique_ptr<ProcessMesh> mesh;
      ASSERT_TRUE(ProcessMesh::Make(comms[w].get(), lay.tensor, lay.pipeline, &mesh).ok());
      const MeshCoords c = mesh->coords();
      CountingCommunicator pipe(mesh->pipeline());
      std::vector<StageLayers> parts;
      ASSERT_TRUE(
          PartitionStages("", PartitionModelOf(spec), lay.pipeline, lay.chunks, &parts).ok());
      PipelineSchedule sched;
      ASSERT_TRUE(MakePipelineSchedule(lay.pipeline, kMicro, lay.chunks, &sched).ok());
      auto be = MakeCpuBackend(1);
      be->SetPrecision(lay.precision);
      std::vector<std::unique_ptr<GptModel>> owned;
      std::vector<GptModel*> chunks;
      std::vector<float*> moms, vars;
      for (int ch = 0; ch < lay.chunks; ++ch) {
        owned.push_back(std::make_unique<GptModel>(
            be.get(), spec, TensorParallel{mesh->tensor(), lay.sequence_parallel},
            ModelStageOf(parts, lay.pipeline, c.pp, ch)));
        owned.back()->set_recompute(lay.recompute);
        owned.back()->Initialize(kSeed, 0.02f);
        chunks.push_back(owned.back().get());
        moms.push_back(be->AllocFloats(chunks.back()->num_params()));
        vars.push_back(be->AllocFloats(chunks.back()->num_params()));
      }
      for (int s = 0; s < steps; ++s) {
        std::vector<std::vector<int32_t>> in, tg;
        std::vector<PipelineMicroBatch> mbs;
        for (int k = 0; k < kMicro; ++k) {
          in.push_back(Tokens(s, k, 0, spec.vocab));
          tg.push_back(Tokens(s, k, 1, spec.vocab));
        }
        for (int k = 0; k < kMicro; ++k) mbs.push_back({in[k].data(), tg[k].data()});
        PipelineStepResult res;
        const Status st = RunPipelineStep(sched, &pipe, chunks, mbs, kBatch, kSeq,
                                          1.0f / (kBatch * kSeq * kMicro), &res);
        ASSERT_TRUE(st.ok()) << st.ToString();
        losses[w].push_back(res.loss_sum / kMicro);
        if (s == 0) {
          std::lock_guard<std::mutex> lock(mu);
          out.sent[c.pp] = pipe.sent;
          for (GptModel* m : chunks) {
            for (const ParamInfo& p : m->params()) {
              auto& slot = grad_slices[p.name + "#" + std::to_string(c.pp)][c.tp];
              slot = HostCopy(*m, m->grad_data(), p);
              infos[p.name] = p;
            }
          }
        }
        for (int ch = 0; ch < lay.chunks; ++ch)
          AdamW(be.get(), chunks[ch], moms[ch], vars[ch], s + 1);
      }
      std::lock_guard<std::mutex> lock(mu);
      for (GptModel* m : chunks) {
        for (const ParamInfo& p : m->params())
          weight_slices[p.name + "#" + std::to_string(c.pp)][c.tp] =
              HostCopy(*m, m->param_data(), p);
      }
      for (int ch = 0; ch < lay.chunks; ++ch) {
        be->Free(moms[ch]);
        be->Free(vars[ch]);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int w = 1; w < world; ++w)
    EXPECT_EQ(losses[w], losses[0]) << "every rank reports the same loss (rank " << w << ")";
  out.losses = losses[0];
  // Whole tensors by name; a name held by two pipeline ranks (the tied embedding) must be the
  // same bits on both.
  auto assemble = [&](std::map<std::string, std::map<int, std::vector<float>>>& slices,
                      std::map<std::string, std::vector<float>>* whole) {
    for (auto& [key, by_tp] : slices) {
      const std::string name = key.substr(0, key.find('#'));
      const ParamInfo& p = infos.at(name);
      size_t n = 1;
      for (int64_t d : p.full_shape) n *= static_cast<size_t>(d);
      std::vector<float> full(n);
      for (auto& [tp, slice] : by_tp)
        InsertShard(slice.data(), p.full_shape, p.split, tp, lay.tensor, full.data());
      auto it = whole->find(name);
      if (it == whole->end()) {
        (*whole)[name] = std::move(full);
      } else if (it->second != full) {
        out.tied_copies_equal = false;
        ADD_FAILURE() << name << " differs between its two pipeline stages";
      }
    }
  };
  assemble(grad_slices, &out.grads);
  assemble(weight_slices, &out.weights);
  return out;
}

double MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}

std::string Name(const Layout& l) {
  std::string s = "T" + std::to_string(l.tensor) + "xP" + std::to_string(l.pipeline);
  if (l.chunks > 1) s += "xV" + std::to_string(l.chunks);
  if (l.sequence_parallel) s += " sequence parallel";
  return s;
}

// The pipelined run against the one-process one: every parameter's first-step gradient and
// final weight, and every step's loss, within fp32 tolerance. Prints the measured maxima.
void ExpectSameModel(const RunResult& ref, const RunResult& got, const std::string& what) {
  ASSERT_EQ(ref.losses.size(), got.losses.size());
  ASSERT_EQ(ref.grads.size(), got.grads.size()) << what << ": every parameter, once";
  double loss_diff = 0, grad_diff = 0, weight_diff = 0;
  for (size_t s = 0; s < ref.losses.size(); ++s)
    loss_diff = std::max(loss_diff, std::fabs(ref.losses[s] - got.losses[s]));
  for (const auto& [name, g] : ref.grads) {
    ASSERT_TRUE(got.grads.count(name)) << what << ": no stage holds " << name;
    const double d = MaxDiff(g, got.grads.at(name));
    EXPECT_LT(d, 1e-6) << what << ": gradient of " << name;
    grad_diff = std::max(grad_diff, d);
    weight_diff = std::max(weight_diff, MaxDiff(ref.weights.at(name), got.weights.at(name)));
  }
  EXPECT_LT(loss_diff, 1e-5) << what;
  EXPECT_LT(weight_diff, 1e-5) << what;
  EXPECT_TRUE(got.tied_copies_equal) << what;
  std::printf(
      "%s: %zu steps, max |loss diff| %.3g, max |gradient diff| %.3g, max |weight diff| "
      "%.3g\n",
      what.c_str(), ref.losses.size(), loss_diff, grad_diff, weight_diff);
  testing::Test::RecordProperty(what + ".max_grad_diff", std::to_string(grad_diff));
}

struct Case {
  const char* name;
  GptSpec (*spec)();
};

class PipelineStageTest : public testing::TestWithParam<Case> {};

TEST_P(PipelineStageTest, StagesHoldTheWholeModelsInitialValues) {
  const GptSpec spec = GetParam().spec();
  auto be = MakeCpuBackend(1);
  GptModel whole(be.get(), spec);
  whole.Initialize(kSeed, 0.02f);
  std::vector<StageLayers> parts;
  ASSERT_TRUE(PartitionStages("", PartitionModelOf(spec), 4, 1, &parts).ok());
  size_t seen = 0;
  for (int r = 0; r < 4; ++r) {
    GptModel stage(be.get(), spec, {}, ModelStageOf(parts, 4, r, 0));
    stage.Initialize(kSeed, 0.02f);
    EXPECT_EQ(stage.num_stage_layers(), 1);
    for (const ParamInfo& p : stage.params()) {
      const ParamInfo* q = whole.FindParam(p.name);
      ASSERT_NE(q, nullptr) << p.name;
      EXPECT_EQ(HostCopy(stage, stage.param_data(), p), HostCopy(whole, whole.param_data(), *q))
          << "stage " << r << ": " << p.name;
      if (p.name.rfind("layers.", 0) == 0) {
        EXPECT_EQ(p.name.substr(0, 9), "layers." + std::to_string(r) + ".");
      }
      ++seen;
    }
  }
  // Every tensor once, and the tied embedding twice (first and last stage).
  EXPECT_EQ(seen, whole.params().size() + (spec.untie_embeddings ? 0 : 1));
}

TEST_P(PipelineStageTest, OneFOneBOnTwoAndFourStagesIsTheOneProcessModel) {
  const GptSpec spec = GetParam().spec();
  const RunResult ref = OneProcess(spec, 3);
  for (const Layout& lay : {Layout{1, 2, 1}, Layout{1, 4, 1}}) {
    const RunResult got = Pipelined(spec, lay, 3);
    ExpectSameModel(ref, got, std::string(GetParam().name) + " " + Name(lay));
  }
}

TEST_P(PipelineStageTest, InterleavedTwoChunksIsTheOneProcessModel) {
  const GptSpec spec = GetParam().spec();
  const Layout lay{1, 2, 2};
  ExpectSameModel(OneProcess(spec, 3), Pipelined(spec, lay, 3),
                  std::string(GetParam().name) + " " + Name(lay));
}

TEST_P(PipelineStageTest, TensorTwoByPipelineTwoIsTheOneProcessModel) {
  const GptSpec spec = GetParam().spec();
  const RunResult ref = OneProcess(spec, 3);
  Layout sp{2, 2, 1};
  sp.sequence_parallel = true;  // the boundary activations are each rank's B*T/2 rows
  for (const Layout& lay : {Layout{2, 2, 1}, sp}) {
    const RunResult got = Pipelined(spec, lay, 3);
    // The tensor-parallel sums round differently: tolerance as the tensor-parallel tests'.
    double loss_diff = 0, grad_rel = 0;
    for (size_t s = 0; s < ref.losses.size(); ++s)
      loss_diff = std::max(loss_diff, std::fabs(ref.losses[s] - got.losses[s]));
    for (const auto& [name, g] : ref.grads) {
      double scale = 1e-6;
      for (float v : g) scale = std::max(scale, std::fabs(double(v)));
      const double rel = MaxDiff(g, got.grads.at(name)) / scale;
      EXPECT_LT(rel, 1e-4) << Name(lay) << ": " << name;
      grad_rel = std::max(grad_rel, rel);
    }
    EXPECT_LT(loss_diff, 1e-4) << Name(lay);
    EXPECT_TRUE(got.tied_copies_equal) << Name(lay);
    std::printf("%s %s: 3 steps, max |loss diff| %.3g, max relative gradient diff %.3g\n",
                GetParam().name, Name(lay).c_str(), loss_diff, grad_rel);
  }
}

TEST_P(PipelineStageTest, EachLayoutIsTheSameBitsRunAfterRun) {
  const GptSpec spec = GetParam().spec();
  for (const Layout& lay : {Layout{1, 2, 1}, Layout{1, 2, 2}, Layout{2, 2, 1}}) {
    const RunResult a = Pipelined(spec, lay, 2), b = Pipelined(spec, lay, 2);
    EXPECT_EQ(a.losses, b.losses) << Name(lay);
    EXPECT_EQ(a.grads, b.grads) << Name(lay);
    EXPECT_EQ(a.weights, b.weights) << Name(lay);
  }
}

TEST_P(PipelineStageTest, RecomputationOnStagesGivesTheSameBits) {
  const GptSpec spec = GetParam().spec();
  const RunResult none = Pipelined(spec, {1, 2, 1}, 1);
  for (Recompute r : {Recompute::kSelective, Recompute::kFull}) {
    const RunResult got = Pipelined(spec, {1, 2, 1, r}, 1);
    EXPECT_EQ(got.losses, none.losses) << RecomputeName(r);
    EXPECT_EQ(got.grads, none.grads) << RecomputeName(r);
  }
}

// bf16: each stage converts its own weights and keeps each slot's 16-bit matmul inputs; the
// untied Llama shape is the one-process bf16 run's bits, the tied one within rounding of the
// embedding gradient's sum.
TEST_P(PipelineStageTest, Bf16StagesAreTheOneProcessBf16Model) {
  const GptSpec spec = GetParam().spec();
  const RunResult ref = OneProcess(spec, 2, Precision::kBf16);
  for (const Layout& lay : {Layout{1, 2, 1, Recompute::kNone, Precision::kBf16},
                            Layout{1, 2, 2, Recompute::kNone, Precision::kBf16}}) {
    const RunResult got = Pipelined(spec, lay, 2);
    double loss_diff = 0, grad_diff = 0;
    for (size_t s = 0; s < ref.losses.size(); ++s)
      loss_diff = std::max(loss_diff, std::fabs(ref.losses[s] - got.losses[s]));
    for (const auto& [name, g] : ref.grads)
      grad_diff = std::max(grad_diff, MaxDiff(g, got.grads.at(name)));
    if (spec.untie_embeddings) {
      EXPECT_EQ(loss_diff, 0.0) << Name(lay);
      EXPECT_EQ(grad_diff, 0.0) << Name(lay);
    }
    EXPECT_LT(loss_diff, 1e-3) << Name(lay);
    EXPECT_LT(grad_diff, 1e-5) << Name(lay);
    EXPECT_TRUE(got.tied_copies_equal);
    std::printf("%s bf16 %s: max |loss diff| %.3g, max |gradient diff| %.3g\n", GetParam().name,
                Name(lay).c_str(), loss_diff, grad_diff);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, PipelineStageTest,
                         testing::Values(Case{"gpt2", Gpt2Spec}, Case{"llama", LlamaSpec}),
                         [](const auto& info) { return std::string(info.param.name); });

// The bytes on the pipeline group, counted at the communicator: each micro-batch crosses each
// boundary once forward (its activation) and once backward (its gradient), b s h floats each; the
// tied embedding adds one message of its gradient each way between first and last stage.
TEST(PipelineStepTest, SendsBshFloatsPerMicroBatchPerBoundary) {
  const GptSpec spec = Gpt2Spec();
  const size_t bsh = static_cast<size_t>(kBatch) * kSeq * spec.hidden;
  const size_t wte = static_cast<size_t>(spec.padded_vocab) * spec.hidden;
  for (const Layout& lay : {Layout{1, 2, 1}, Layout{1, 4, 1}, Layout{1, 2, 2}}) {
    const RunResult got = Pipelined(spec, lay, 1);
    size_t activation_msgs = 0;
    for (const auto& [pp, sizes] : got.sent) {
      size_t tied = 0;
      for (size_t n : sizes) {
        if (n == bsh) {
          ++activation_msgs;
        } else {
          EXPECT_EQ(n, wte) << Name(lay) << " stage " << pp << " sent " << n << " floats";
          ++tied;
        }
      }
      EXPECT_EQ(tied, pp == 0 || pp == lay.pipeline - 1 ? 1u : 0u) << Name(lay) << " " << pp;
    }
    // 2 m (P V - 1): one activation and one gradient per micro-batch per boundary.
    EXPECT_EQ(activation_msgs, 2u * kMicro * (lay.pipeline * lay.chunks - 1)) << Name(lay);
    std::printf("%s: %zu messages of b s h x 4 = %zu bytes\n", Name(lay).c_str(), activation_msgs,
                bsh * 4);
  }
}

TEST(PipelineStepTest, TiedEmbeddingCopiesStayIdenticalOverAdamWSteps) {
  const RunResult got = Pipelined(Gpt2Spec(), {1, 4, 1}, 4);
  EXPECT_TRUE(got.tied_copies_equal);  // Pipelined compares the copies' gradients and weights
  EXPECT_EQ(got.losses.size(), 4u);
}

TEST(PipelineStepTest, RefusesChunksThatDoNotMatchTheSchedule) {
  const GptSpec spec = Gpt2Spec();
  auto comms = MakeThreadGroup(1);
  auto be = MakeCpuBackend(1);
  GptModel whole(be.get(), spec);
  PipelineSchedule sched;
  ASSERT_TRUE(MakePipelineSchedule(1, 2, 1, &sched).ok());
  const auto t = Tokens(0, 0, 0, spec.vocab);
  const std::vector<PipelineMicroBatch> one = {{t.data(), t.data()}};
  Status st = RunPipelineStep(sched, comms[0].get(), {&whole}, one, kBatch, kSeq, 1.0f, nullptr);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.ToString().find("2 micro-batches but 1"), std::string::npos) << st.ToString();
  // A stage model where the whole one belongs.
  std::vector<StageLayers> parts;
  ASSERT_TRUE(PartitionStages("", PartitionModelOf(spec), 2, 1, &parts).ok());
  GptModel first(be.get(), spec, {}, ModelStageOf(parts, 2, 0, 0));
  const std::vector<PipelineMicroBatch> two = {{t.data(), t.data()}, {t.data(), t.data()}};
  st = RunPipelineStep(sched, comms[0].get(), {&first}, two, kBatch, kSeq, 1.0f, nullptr);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.ToString().find("head"), std::string::npos) << st.ToString();
}

TEST(PipelineStepTest, StageModelRefusesAStageWithoutItsEnds) {
  ModelStage s;
  s.first_layer = 1;  // the embedding where layer 0 is not
  s.last_layer = 4;
  auto be = MakeCpuBackend(1);
  EXPECT_THROW(GptModel(be.get(), Gpt2Spec(), {}, s), KeelError);
}

}  // namespace
}  // namespace keel

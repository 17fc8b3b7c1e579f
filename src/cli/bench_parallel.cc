// `keel bench parallel`: tensor and pipeline parallelism on the real model (GptModel stages run by
// RunPipelineStep, ranks as threads over a ProcessMesh), against the Megatron-LM papers' models:
//   - the bytes each rank sends per iteration, counted at its tensor and pipeline communicators
//     (comm/counting_communicator.h), against the analytic count term by term: Shoeybi et al.
//     2019's 4 all-reduces of b s h per layer per micro-batch (Korthikanti et al. 2022's 4
//     all-gathers and 4 reduce-scatters under sequence parallelism), Narayanan et al. 2021's
//     b s h per micro-batch per pipeline boundary each way, and the vocabulary-parallel
//     embedding, output layer and cross-entropy, the tied embedding and the loss. Bytes are
//     deterministic: any difference fails the command.
//   - the pipeline bubble measured on real stage computation, each rank one thread with one
//     compute thread, against (P-1)/(m+P-1) and (P-1)/(V m+P-1) interleaved. `keel bench
//     --pipeline` measures the same schedule with sleeping stages, apart from the machine.
// docs/benchmarks.md has the tables.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "cli/commands.h"
#include "cli/exit_code.h"
#include "cli/usage_exit.h"
#include "comm/communicator.h"
#include "comm/counting_communicator.h"
#include "comm/process_mesh.h"
#include "core/log.h"
#include "model/gpt.h"
#include "pipeline/pipeline_step.h"
#include "pipeline/schedule.h"
#include "pipeline/stage_partition.h"

namespace keel::cli {
namespace {

constexpr uint64_t kSeed = 1234;
constexpr int64_t kFloat = 4;

struct Shape {
  std::string name;
  GptSpec spec;
  int b = 1, s = 1;  // micro-batch size, sequence length
};

// GPT-2's architecture (learned positions, LayerNorm with biases, GELU, tied output layer).
Shape Gpt2Shape(int layers, int hidden, int seq, int b) {
  Shape sh;
  sh.name = "gpt2";
  GptSpec& s = sh.spec;
  s.num_layers = layers;
  s.hidden = hidden;
  s.heads = 4;
  s.ffn_hidden = 4 * hidden;
  s.max_positions = seq;
  s.vocab = 1000;
  s.padded_vocab = 1024;  // divisible by 128 T for T <= 8, as Megatron pads
  sh.b = b;
  sh.s = seq;
  return sh;
}

// Llama's (RoPE, RMSNorm, SwiGLU, grouped-query attention, no biases, untied output layer).
Shape LlamaShape(int layers, int hidden, int seq, int b) {
  Shape sh;
  sh.name = "llama";
  GptSpec& s = sh.spec;
  s.num_layers = layers;
  s.hidden = hidden;
  s.heads = 8;
  s.SetKvHeads(4);
  s.ffn_hidden = 3 * hidden;
  s.max_positions = seq;
  s.vocab = 1000;
  s.padded_vocab = 1024;
  s.rope = true;
  s.rmsnorm = true;
  s.swiglu = true;
  s.bias = false;
  s.untie_embeddings = true;
  sh.b = b;
  sh.s = seq;
  return sh;
}

struct Layout {
  int T = 1, P = 1, V = 1;
  bool sp = false;
  std::string Name() const {
    std::string n;
    if (T > 1) n += fmt::format("T{}", T);
    if (P > 1) n += fmt::format("{}P{}", n.empty() ? "" : "x", P);
    if (V > 1) n += fmt::format(" V{}", V);
    if (sp) n += " SP";
    return n;
  }
};

// What one rank saw in one iteration.
struct RankRun {
  int pp = 0, tp = 0;
  int layers = 0;  // transformer layers this rank holds (all its chunks)
  std::map<std::string, CountingCommunicator::Count> tensor, pipeline;
  std::vector<double> busy, start, end;  // per iteration: seconds computing; steady-clock seconds
  // Per chunk: this thread's CPU seconds for one micro-batch's forward and backward, measured
  // after the iterations (median of 3): what the stage costs without the machine's other load.
  std::vector<double> forward_cpu, backward_cpu;
};

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<int32_t> Tokens(int iter, int mb, int salt, int n, int vocab) {
  std::vector<int32_t> t(n);
  uint64_t x = 0x9e3779b97f4a7c15ull * (1 + iter * 131 + mb * 7 + salt);
  for (int i = 0; i < n; ++i) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 29;
    t[i] = static_cast<int32_t>(x % static_cast<uint64_t>(vocab));
  }
  return t;
}

// Runs `iters` iterations of `m` micro-batches at `lay` on ranks as threads; the counts are the
// last iteration's. Every rank's backend has one compute thread.
Status RunLayout(const Shape& shape, const Layout& lay, int m, int iters, std::vector<RankRun>* out,
                 bool stage_costs = false) {
  const int world = lay.T * lay.P;
  if (Status st = GptModel::CheckTensorParallel(shape.spec, lay.T); !st.ok()) return st;
  std::vector<StageLayers> parts;
  if (Status st = PartitionStages("", PartitionModelOf(shape.spec), lay.P, lay.V, &parts); !st.ok())
    return st;
  PipelineSchedule sched;
  if (Status st = MakePipelineSchedule(lay.P, m, lay.V, &sched); !st.ok()) return st;
  auto comms = MakeThreadGroup(world);
  out->assign(world, RankRun{});
  std::vector<Status> status(world);
  std::vector<std::thread> threads;
  const int n = shape.b * shape.s;
  const float dloss = 1.0f / static_cast<float>(n * m);
  for (int w = 0; w < world; ++w) {
    threads.emplace_back([&, w] {
      RankRun& run = (*out)[w];
      std::unique_ptr<ProcessMesh> mesh;
      status[w] = ProcessMesh::Make(comms[w].get(), lay.T, lay.P, &mesh);
      if (!status[w].ok()) return;  // the same on every rank: no one is left waiting
      run.pp = mesh->coords().pp;
      run.tp = mesh->coords().tp;
      CountingCommunicator tensor(mesh->tensor()), pipe(mesh->pipeline());
      auto be = MakeCpuBackend(1);
      std::vector<std::unique_ptr<GptModel>> owned;
      std::vector<GptModel*> chunks;
      for (int c = 0; c < lay.V; ++c) {
        owned.push_back(std::make_unique<GptModel>(be.get(), shape.spec,
                                                   TensorParallel{&tensor, lay.sp},
                                                   ModelStageOf(parts, lay.P, run.pp, c)));
        owned.back()->Initialize(kSeed, 0.02f);
        chunks.push_back(owned.back().get());
        run.layers += owned.back()->num_stage_layers();
      }
      for (int it = 0; it < iters; ++it) {
        std::vector<std::vector<int32_t>> in, tg;
        for (int k = 0; k < m; ++k) {
          in.push_back(Tokens(it, k, 0, n, shape.spec.vocab));
          tg.push_back(Tokens(it, k, 1, n, shape.spec.vocab));
        }
        std::vector<PipelineMicroBatch> mbs;
        for (int k = 0; k < m; ++k) mbs.push_back({in[k].data(), tg[k].data()});
        tensor.Reset();
        pipe.Reset();
        comms[w]->Barrier();  // every rank starts the iteration together (not counted)
        const double t0 = Now();
        PipelineStepResult res;
        status[w] = RunPipelineStep(sched, &pipe, chunks, mbs, shape.b, shape.s, dloss, &res);
        const double t1 = Now();
        if (!status[w].ok()) comms[w]->Abort(ToInt(ExitCode::kRuntimeFailure));
        run.start.push_back(t0);
        run.end.push_back(t1);
        run.busy.push_back(res.stats.compute_seconds);
      }
      if (stage_costs && lay.T == 1) {
        // Each chunk alone on zeros (its cost does not depend on the values), timed in CPU time.
        const size_t floats = chunks[0]->StageActivationFloats(shape.b, shape.s);
        std::vector<float> in(floats, 0.0f), out_buf(floats), grad(floats, 0.0f), in_grad(floats);
        const auto tokens = Tokens(0, 0, 0, n, shape.spec.vocab);
        for (GptModel* c : chunks) {
          std::vector<double> f, b;
          for (int rep = 0; rep < 3; ++rep) {
            const bool first = c->stage().embedding, last = c->stage().head;
            double t = ThreadCpuSeconds();
            c->StageForward(0, tokens.data(), first ? nullptr : in.data(), tokens.data(), shape.b,
                            shape.s, dloss, last ? nullptr : out_buf.data());
            f.push_back(ThreadCpuSeconds() - t);
            t = ThreadCpuSeconds();
            c->StageBackward(0, last ? nullptr : grad.data(), first ? nullptr : in_grad.data());
            b.push_back(ThreadCpuSeconds() - t);
          }
          std::sort(f.begin(), f.end());
          std::sort(b.begin(), b.end());
          run.forward_cpu.push_back(f[1]);
          run.backward_cpu.push_back(b[1]);
        }
      }
      run.tensor = tensor.counts();
      run.pipeline = pipe.counts();
    });
  }
  for (auto& t : threads) t.join();
  for (const Status& st : status) {
    if (!st.ok()) return st;
  }
  return Status::OK();
}

// One term of the analytic count: what it is, whose model it is, bytes per rank per iteration.
struct Term {
  std::string what;
  bool paper;  // the papers' headline count (layers' collectives, boundary activations)
  int64_t bytes;
};

// The analytic bytes of rank (pp, tp) per iteration, term by term. AR(n): an all-reduce of n
// floats sends 2 (T-1)/T n floats per rank (keel's reduce-scatter then all-gather, the ring's
// volume); an all-gather or reduce-scatter of a b s h tensor in chunks of b s h / T sends
// (T-1)/T b s h.
void Analytic(const Shape& sh, const Layout& lay, int m, int pp, int layers,
              std::vector<Term>* tensor, std::vector<Term>* pipeline) {
  const GptSpec& s = sh.spec;
  const int64_t T = lay.T, P = lay.P, V = lay.V, h = s.hidden;
  const int64_t N = int64_t{sh.b} * sh.s, X = N * h;  // tokens, boundary floats
  const bool emb = pp == 0, head = pp == P - 1;
  auto AR = [&](int64_t n) { return 2 * (T - 1) * n * kFloat / T; };
  const int64_t chunk = (T - 1) * X / T * kFloat;  // one all-gather or reduce-scatter of b s h
  tensor->clear();
  pipeline->clear();
  if (T > 1 && !lay.sp) {
    tensor->push_back({"layers: 4 all-reduces of b s h per layer (2 forward, 2 backward)", true,
                       m * layers * 4 * AR(X)});
    if (emb)
      tensor->push_back(
          {"embedding: all-reduce of the vocabulary-parallel lookup", false, m * AR(X)});
    if (head)
      tensor->push_back({"output layer: all-reduce of its input gradient", false, m * AR(X)});
  }
  if (T > 1 && lay.sp) {
    tensor->push_back({"layers: 4 all-gathers + 4 reduce-scatters of b s h per layer", true,
                       m * layers * 8 * chunk});
    if (emb)
      tensor->push_back(
          {"embedding: reduce-scatter forward, all-gather backward", false, m * 2 * chunk});
    if (head)
      tensor->push_back(
          {"output layer: all-gather forward, reduce-scatter backward", false, m * 2 * chunk});
    // The norms see only this rank's rows: their weight (and bias) gradients are partial sums.
    const int64_t per_norm = s.rmsnorm ? h : 2 * h;
    const int64_t norms = per_norm * (2 * layers + (head ? 1 : 0));
    tensor->push_back({"norm gradients: all-reduce per micro-batch (Megatron: per iteration)",
                       false, m * AR(norms)});
  }
  if (T > 1 && head)
    tensor->push_back({"cross-entropy: row max (gather of b s) + all-reduce of 2 b s", false,
                       m * ((T - 1) * N * kFloat + AR(2 * N))});
  if (P > 1) {
    int64_t messages = 0;  // per micro-batch: an activation forward, a gradient backward
    for (int64_t c = 0; c < V; ++c) {
      const int64_t v = c * P + pp;
      messages += (v < P * V - 1 ? 1 : 0) + (v > 0 ? 1 : 0);
    }
    const int64_t floats = lay.sp ? X / T : X;
    pipeline->push_back({lay.sp ? "boundaries: b s h / T per micro-batch each way"
                                : "boundaries: b s h per micro-batch each way",
                         true, m * messages * floats * kFloat});
    if (!s.untie_embeddings && (emb || head))
      pipeline->push_back({"tied embedding: the word-embedding gradient, first <-> last stage",
                           false, s.padded_vocab / T * h * kFloat});
    pipeline->push_back({"loss: one double to every other stage", false, (P - 1) * 8});
  }
}

int64_t Sum(const std::vector<Term>& terms) {
  int64_t t = 0;
  for (const Term& x : terms) t += x.bytes;
  return t;
}

int64_t Sum(const std::map<std::string, CountingCommunicator::Count>& counts) {
  int64_t t = 0;
  for (const auto& [kind, c] : counts) t += c.bytes;
  return t;
}

std::string Kinds(const std::map<std::string, CountingCommunicator::Count>& counts) {
  std::string s;
  for (const auto& [kind, c] : counts)
    s += fmt::format("{}{} x{} = {} B", s.empty() ? "" : ", ", kind, c.calls, c.bytes);
  return s.empty() ? "none" : s;
}

int BytesTable(const std::vector<Shape>& shapes, int m, bool verbose) {
  const std::vector<Layout> layouts = {{2, 1, 1, false}, {2, 1, 1, true},  {1, 2, 1, false},
                                       {1, 2, 2, false}, {2, 2, 1, false}, {2, 2, 1, true}};
  Log("bytes sent per rank per iteration, counted at the rank's tensor and pipeline "
      "communicators, against the analytic count; m = {} micro-batches; the rows are tensor rank "
      "0's (every tensor rank is held to the same count, and shown when off it)",
      m);
  Log("{:<6} {:<10} {:>5} {:>6} {:>11} {:>11} {:>11} {:>11} {:>11} {:>8} {:>7}", "shape", "layout",
      "stage", "layers", "tensor", "analytic", "pipeline", "analytic", "papers'", "ratio",
      "papers");
  int mismatches = 0;
  for (const Shape& sh : shapes) {
    for (const Layout& lay : layouts) {
      std::vector<RankRun> runs;
      if (Status st = RunLayout(sh, lay, m, 1, &runs); !st.ok()) return Fail(st);
      std::sort(runs.begin(), runs.end(), [](const RankRun& a, const RankRun& b) {
        return std::tie(a.pp, a.tp) < std::tie(b.pp, b.tp);
      });
      for (const RankRun& r : runs) {
        std::vector<Term> tensor, pipeline;
        Analytic(sh, lay, m, r.pp, r.layers, &tensor, &pipeline);
        const int64_t tm = Sum(r.tensor), pm = Sum(r.pipeline);
        const int64_t ta = Sum(tensor), pa = Sum(pipeline);
        int64_t paper = 0;
        for (const auto* terms : {&tensor, &pipeline}) {
          for (const Term& t : *terms) paper += t.paper ? t.bytes : 0;
        }
        const bool same = tm == ta && pm == pa;
        if (r.tp == 0 || !same) {
          Log("{:<6} {:<10} {:>5} {:>6} {:>11} {:>11} {:>11} {:>11} {:>11} {:>8.4f} {:>6.1f}%",
              sh.name, lay.Name(),
              r.tp == 0 ? fmt::format("{}", r.pp) : fmt::format("{}/t{}", r.pp, r.tp), r.layers, tm,
              ta, pm, pa, paper,
              ta + pa > 0 ? static_cast<double>(tm + pm) / static_cast<double>(ta + pa) : 1.0,
              ta + pa > 0 ? 100.0 * paper / (ta + pa) : 0.0);
        }
        if (!same || (verbose && r.tp == 0)) {
          for (const auto* terms : {&tensor, &pipeline}) {
            for (const Term& t : *terms)
              Log("    analytic {}{}: {} B", t.what, t.paper ? " [papers]" : "", t.bytes);
          }
          Log("    measured tensor: {}", Kinds(r.tensor));
          Log("    measured pipeline: {}", Kinds(r.pipeline));
        }
        if (!same) {
          ++mismatches;
          LogError(fmt::format(
              "error: {} {} stage {} tensor rank {}: measured {} B (tensor) + {} B (pipeline), "
              "analytic {} + {}",
              sh.name, lay.Name(), r.pp, r.tp, tm, pm, ta, pa));
        }
      }
    }
  }
  if (mismatches > 0) {
    LogError(fmt::format(
        "error: {} ranks sent other bytes than the analytic count (terms above): the model's "
        "communication changed; fix it or the count in src/cli/bench_parallel.cc",
        mismatches));
    return ToInt(ExitCode::kRuntimeFailure);
  }
  Log("every rank: measured == analytic (ratio 1 exactly)");
  return 0;
}

double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// The schedule's actions replayed with each (stage, chunk)'s measured forward and backward cost
// and free point to point, a send and its receive meeting when both stages reach them (the
// rendezvous of the executor): the iteration one core per stage with these costs would take.
// Out: the makespan and every stage's compute.
Status Replay(const PipelineSchedule& s, const std::vector<RankRun>& runs, double* makespan,
              std::vector<double>* busy) {
  const int P = s.stages;
  std::vector<size_t> next(P, 0);
  std::vector<double> t(P, 0.0);
  busy->assign(P, 0.0);
  auto matches = [&](const PipeAction& a, int r, const PipeAction& b) {
    if (b.peer != r) return false;
    return (a.op == PipeOp::kSendActivation && b.op == PipeOp::kRecvActivation) ||
           (a.op == PipeOp::kSendGrad && b.op == PipeOp::kRecvGrad) ||
           (a.op == PipeOp::kRecvActivation && b.op == PipeOp::kSendActivation) ||
           (a.op == PipeOp::kRecvGrad && b.op == PipeOp::kSendGrad);
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < P; ++r) {
      while (next[r] < s.actions[r].size()) {
        const PipeAction& a = s.actions[r][next[r]];
        if (a.op == PipeOp::kForward || a.op == PipeOp::kBackward) {
          const double cost = a.op == PipeOp::kForward ? runs[r].forward_cpu[a.chunk]
                                                       : runs[r].backward_cpu[a.chunk];
          t[r] += cost;
          (*busy)[r] += cost;
          ++next[r];
          progress = true;
          continue;
        }
        const int p = a.peer;
        if (next[p] >= s.actions[p].size() || !matches(a, r, s.actions[p][next[p]])) break;
        t[r] = t[p] = std::max(t[r], t[p]);
        ++next[r];
        ++next[p];
        progress = true;
      }
    }
  }
  for (int r = 0; r < P; ++r) {
    if (next[r] != s.actions[r].size())
      return Status::Internal(
          fmt::format("replay: stage {} stuck at {}", r, ToString(s.actions[r][next[r]])));
  }
  *makespan = *std::max_element(t.begin(), t.end());
  return Status::OK();
}

int BubbleTable(const Shape& sh, bool quick, int repeats) {
  struct Case {
    int P, V, m;
  };
  std::vector<Case> cases = {{2, 1, 2}, {2, 1, 4}, {2, 1, 8}, {2, 2, 4},
                             {2, 2, 8}, {4, 1, 8}, {4, 2, 8}};
  if (quick) cases = {{2, 1, 4}, {2, 2, 4}};
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  Log("pipeline bubble on real stages ({}: {} layers, hidden {}, b {}, s {}), ranks as threads "
      "with one compute thread each, {} cores; median of {} iterations after one warm-up",
      sh.name, sh.spec.num_layers, sh.spec.hidden, sh.b, sh.s, cores, repeats);
  Log("bubble = 1 - compute / iteration (iteration: first rank's start to last rank's end), for "
      "the busiest stage and the mean over stages; measured on the wall clock, and replayed: the "
      "schedule run with each chunk's forward and backward CPU time (what one idle core per "
      "stage gives); formula (P-1)/(V m+P-1); cpu: the CPU the stage threads got, of one core "
      "each; imbal.: the replay's busiest stage's compute over the lightest's");
  Log("{:>2} {:>2} {:>3} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>6}", "P", "V",
      "m", "iter ms", "busy ms", "busiest", "mean", "replay", "r. mean", "formula", "simulated",
      "cpu", "imbal.");
  for (const Case& c : cases) {
    Layout lay{1, c.P, c.V, false};
    std::vector<RankRun> runs;
    const double cpu0 = ProcessCpuSeconds(), wall0 = Now();
    if (Status st = RunLayout(sh, lay, c.m, repeats + 1, &runs, true); !st.ok()) return Fail(st);
    const double cpu_share = (ProcessCpuSeconds() - cpu0) / ((Now() - wall0) * c.P);
    std::vector<double> iter_ms, busy_ms, mean_b, busiest_b;
    for (int it = 1; it <= repeats; ++it) {  // iteration 0 warms up (lays out the activations)
      double t0 = 1e300, t1 = 0, sum = 0, busy = 0;
      for (const RankRun& r : runs) {
        t0 = std::min(t0, r.start[it]);
        t1 = std::max(t1, r.end[it]);
      }
      for (const RankRun& r : runs) {
        const double b = 1.0 - r.busy[it] / (t1 - t0);
        sum += b;
        busy = std::max(busy, r.busy[it]);
      }
      iter_ms.push_back(1e3 * (t1 - t0));
      busy_ms.push_back(1e3 * busy);
      mean_b.push_back(sum / runs.size());
      busiest_b.push_back(1.0 - busy / (t1 - t0));
    }
    PipelineSchedule sched;
    PipeSimulation sim;
    if (Status st = MakePipelineSchedule(c.P, c.m, c.V, &sched); !st.ok()) return Fail(st);
    if (Status st = SimulateSchedule(sched, PipeCosts{}, &sim); !st.ok()) return Fail(st);
    double makespan = 0;
    std::vector<double> replay_busy;
    {
      // The replay at uniform costs (forward 1, backward 2 per stage) is the simulation's bubble.
      std::vector<RankRun> uniform(c.P);
      for (RankRun& u : uniform) {
        u.forward_cpu.assign(c.V, 1.0 / c.V);
        u.backward_cpu.assign(c.V, 2.0 / c.V);
      }
      if (Status st = Replay(sched, uniform, &makespan, &replay_busy); !st.ok()) return Fail(st);
      const double b = 1.0 - *std::max_element(replay_busy.begin(), replay_busy.end()) / makespan;
      if (std::abs(b - sim.bubble_fraction) > 1e-9)
        return Fail(Status::Internal(
            fmt::format("replay at uniform costs gives a bubble of {} but the simulation {}", b,
                        sim.bubble_fraction)));
    }
    if (Status st = Replay(sched, runs, &makespan, &replay_busy); !st.ok()) return Fail(st);
    const double imbalance = *std::max_element(replay_busy.begin(), replay_busy.end()) /
                             *std::min_element(replay_busy.begin(), replay_busy.end());
    double replay_mean = 0;
    for (double b : replay_busy) replay_mean += (1.0 - b / makespan) / c.P;
    const double replay_busiest =
        1.0 - *std::max_element(replay_busy.begin(), replay_busy.end()) / makespan;
    const double formula = (c.P - 1.0) / (c.V * c.m + c.P - 1);
    Log("{:>2} {:>2} {:>3} {:>9.1f} {:>9.1f} {:>8.1f}% {:>8.1f}% {:>8.1f}% {:>8.1f}% {:>8.1f}% "
        "{:>8.1f}% {:>6.0f}% {:>6.2f}",
        c.P, c.V, c.m, Median(iter_ms), Median(busy_ms), 100 * Median(busiest_b),
        100 * Median(mean_b), 100 * replay_busiest, 100 * replay_mean, 100 * formula,
        100 * sim.bubble_fraction, 100 * cpu_share, imbalance);
  }
  return 0;
}

}  // namespace

int BenchParallel(int argc, const char* const* argv) {
  CLI::App app(
      "Tensor and pipeline parallelism on the real model, ranks as threads: bytes per rank per "
      "iteration against the Megatron-LM papers' counts (exact; a difference fails), and the "
      "measured pipeline bubble against (P-1)/(V m+P-1)",
      "keel bench parallel");
  bool bytes_only = false, bubble_only = false, quick = false, verbose = false;
  int repeats = 5, m = 4;
  app.add_flag("--bytes", bytes_only, "only the bytes table");
  app.add_flag("--bubble", bubble_only, "only the bubble table");
  app.add_flag("--quick", quick, "small shapes and two bubble cases, one timed iteration (tests)");
  app.add_flag("--verbose", verbose, "every rank's analytic terms and measured collectives");
  app.add_option("--repeats", repeats, "bubble: timed iterations per case (median reported)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  app.add_option("--micro-batches", m, "bytes: micro-batches per iteration")
      ->check(CLI::Range(2, 64))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return UsageExit(app, e);
  }
  if (bytes_only && bubble_only) {
    LogError("error: --bytes and --bubble each select one table; give neither for both");
    return ToInt(ExitCode::kUsageError);
  }
  if (m % 2 != 0) {
    LogError(fmt::format(
        "error: --micro-batches {}: the interleaved layouts need a multiple of P = 2", m));
    return ToInt(ExitCode::kUsageError);
  }
  if (!bubble_only) {
    const std::vector<Shape> shapes =
        quick ? std::vector<Shape>{Gpt2Shape(4, 64, 32, 2), LlamaShape(4, 64, 32, 2)}
              : std::vector<Shape>{Gpt2Shape(8, 256, 128, 2), LlamaShape(8, 256, 128, 2)};
    if (int rc = BytesTable(shapes, m, verbose); rc != 0) return rc;
  }
  if (!bytes_only) {
    const Shape sh = quick ? Gpt2Shape(4, 64, 32, 2) : Gpt2Shape(8, 128, 128, 2);
    if (int rc = BubbleTable(sh, quick, quick ? 1 : repeats); rc != 0) return rc;
  }
  return 0;
}

}  // namespace keel::cli

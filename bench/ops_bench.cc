// Throughput of the CPU backend's hot ops: the linear layer's GEMMs at GPT-2 small shapes and
// causal attention. GFLOP/s counts useful flops only (the causal half of the attention products).
//   ./ops_bench --benchmark_filter=Matmul
#include <benchmark/benchmark.h>

#include <memory>
#include <vector>

#include "backend/backend.h"

namespace keel {
namespace {

Backend* Cpu() {
  static std::unique_ptr<Backend> be = MakeCpuBackend(0);
  return be.get();
}

// A backend buffer filled with small deterministic values (denormal-free, non-trivial).
struct Buffer {
  Buffer(Backend* be, size_t n, float scale) : be(be), p(be->AllocFloats(n)) {
    for (size_t i = 0; i < n; i++)
      p[i] = scale * (static_cast<float>((i * 7919) % 1000) - 500.0f) / 500.0f;
  }
  ~Buffer() { be->Free(p); }
  Backend* be;
  float* p;
};

// out (N,OC) = inp (N,IC) @ W^T + b: 2 N IC OC flops.
void BM_MatmulForward(benchmark::State& state) {
  const int N = state.range(0), IC = state.range(1), OC = state.range(2);
  Backend* be = Cpu();
  Buffer inp(be, size_t(N) * IC, 1.0f), w(be, size_t(OC) * IC, 0.02f), b(be, OC, 0.1f),
      out(be, size_t(N) * OC, 0.0f);
  for (auto _ : state) {
    be->MatmulForward(out.p, inp.p, w.p, b.p, N, IC, OC);
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * N * IC * OC * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// dinp += dout @ W, dW += dout^T @ inp, db += rowsum(dout): 4 N IC OC flops.
void BM_MatmulBackward(benchmark::State& state) {
  const int N = state.range(0), IC = state.range(1), OC = state.range(2);
  Backend* be = Cpu();
  Buffer inp(be, size_t(N) * IC, 1.0f), w(be, size_t(OC) * IC, 0.02f),
      dout(be, size_t(N) * OC, 1.0f), dinp(be, size_t(N) * IC, 0.0f), dw(be, size_t(OC) * IC, 0.0f),
      db(be, OC, 0.0f);
  for (auto _ : state) {
    be->MatmulBackward(dinp.p, dw.p, db.p, dout.p, inp.p, w.p, N, IC, OC);
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(4.0 * N * IC * OC * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

#define MATMUL_SHAPES                                              \
  ArgNames({"N", "IC", "OC"})                                      \
      ->Args({256, 768, 2304})   /* qkv projection, 256 tokens */  \
      ->Args({2048, 768, 768})   /* attention output projection */ \
      ->Args({2048, 768, 3072})  /* MLP up-projection */           \
      ->Args({1024, 1024, 1024}) /* square reference */            \
      ->Unit(benchmark::kMillisecond)                              \
      ->UseRealTime()
BENCHMARK(BM_MatmulForward)->MATMUL_SHAPES;
BENCHMARK(BM_MatmulBackward)->MATMUL_SHAPES;

// Useful flops of the causal products: QK^T and PV over the T(T+1)/2 kept pairs, 2 hs flops each.
double AttentionForwardFlops(int B, int T, int C) {
  return 2.0 * 2.0 * B * (T * (T + 1.0) / 2) * C;
}

// Forward then backward (4 products backward, 2 forward), as in one training step.
void BM_AttentionForwardBackward(benchmark::State& state) {
  const int B = state.range(0), T = state.range(1), C = state.range(2), NH = state.range(3);
  Backend* be = Cpu();
  Buffer qkv(be, size_t(B) * T * 3 * C, 1.0f), out(be, size_t(B) * T * C, 0.0f),
      att(be, size_t(B) * NH * T * T, 0.0f), dout(be, size_t(B) * T * C, 1.0f),
      dqkv(be, size_t(B) * T * 3 * C, 0.0f);
  for (auto _ : state) {
    be->AttentionForward(out.p, att.p, qkv.p, nullptr, B, T, C, NH);
    be->AttentionBackward(dqkv.p, dout.p, qkv.p, att.p, B, T, C, NH);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * B * T);  // tokens/s
  state.counters["GFLOP/s"] = benchmark::Counter(3.0 * AttentionForwardFlops(B, T, C) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

void BM_AttentionForward(benchmark::State& state) {
  const int B = state.range(0), T = state.range(1), C = state.range(2), NH = state.range(3);
  Backend* be = Cpu();
  Buffer qkv(be, size_t(B) * T * 3 * C, 1.0f), out(be, size_t(B) * T * C, 0.0f),
      att(be, size_t(B) * NH * T * T, 0.0f);
  for (auto _ : state) {
    be->AttentionForward(out.p, att.p, qkv.p, nullptr, B, T, C, NH);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * B * T);
  state.counters["GFLOP/s"] = benchmark::Counter(AttentionForwardFlops(B, T, C) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

#define ATTENTION_SHAPES                           \
  ArgNames({"B", "T", "C", "NH"})                  \
      ->Args({4, 256, 256, 4})                     \
      ->Args({1, 1024, 768, 12}) /* GPT-2 small */ \
      ->Unit(benchmark::kMillisecond)              \
      ->UseRealTime()
BENCHMARK(BM_AttentionForward)->ATTENTION_SHAPES;
BENCHMARK(BM_AttentionForwardBackward)->ATTENTION_SHAPES;

// The optimizer's pass over GPT-2 124M's parameters: AdamW reads weight, gradient and moments
// and writes weight and moments (28 bytes a parameter). bf16_copy 1: the same pass also writes
// the weights' bf16 compute copy (30 bytes); 2, its peer: a separate ToLowPrecision pass after
// the update (34 bytes). GB/s counts the bytes of the fused form. stats: the guard's update
// statistics measured in the same pass (as training does).
void BM_AdamW(benchmark::State& state) {
  const size_t n = 123738624;
  const int copy = static_cast<int>(state.range(0));
  const bool with_stats = state.range(1) != 0;
  std::unique_ptr<Backend> be = MakeCpuBackend(0);
  if (copy) be->SetPrecision(Precision::kBf16);
  Buffer p(be.get(), n, 0.02f), g(be.get(), n, 0.001f), m(be.get(), n, 0.0f), v(be.get(), n, 0.0f);
  uint16_t* lowp = copy ? be->AllocHalves(n) : nullptr;
  int64_t step = 0;
  Backend::AdamWStats stats;
  for (auto _ : state) {
    be->AdamWUpdate(p.p, g.p, m.p, v.p, n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, ++step,
                    with_stats ? &stats : nullptr, 1.0f, copy == 1 ? lowp : nullptr);
    if (copy == 2) be->ToLowPrecision(lowp, p.p, n);
    benchmark::ClobberMemory();
  }
  if (lowp != nullptr) be->Free(lowp);
  state.counters["GB/s"] = benchmark::Counter((copy != 0 ? 30.0 : 28.0) * n * 1e-9,
                                              benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_AdamW)
    ->ArgNames({"bf16_copy", "stats"})
    ->ArgsProduct({{0, 1, 2}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace keel

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("keel_backend", keel::Cpu()->Describe());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

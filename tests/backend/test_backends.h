// The backends every backend-generic test runs on, with how close each must come to the
// double-precision references. A new backend joins the op tests (backend_ops_test.cc) and the
// whole-model reference test (tests/model/gpt_reference_test.cc) with one line in TestBackends().
#pragma once

#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/profiling_backend.h"
#ifdef KEEL_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace keel {
namespace testing_backends {

// Tolerances per backend. The tests state the fp32 CPU backend's tolerances; `scale` multiplies
// every one of them (a reduced-precision backend, e.g. bf16, raises it instead of editing tests).
struct Tolerances {
  double scale = 1.0;
  // Relative error allowed where fp32 arithmetic is exact (Add, Scale by 1/2, embedding sums,
  // copies): 0 demands the same bits.
  double pointwise = 0.0;
  // A mixed-precision backend (products with bf16/fp16 operands, backend.h "mixed precision"):
  // the relative error allowed in matmul and attention results, forward outputs and gradients
  // alike, against double-precision references of the exact math (a few roundings of the
  // format's unit). 0: an fp32 backend, whose op tests use the tolerances they state and finite
  // differences of the backend's own forward.
  double products = 0.0;
  // Multiplies the whole-model reference test's tolerances (the products' errors compound
  // through the layers).
  double model = 1.0;
};

struct TestBackend {
  std::string name;  // test-name suffix: BackendOpsTest.Matmul/cpu
  // `threads` is the parallelism to use (the CPU backend's thread count); a backend without such a
  // knob ignores it. The tests build one backend with 2 and one with 1 and demand the reductions
  // documented as thread-count independent give the same bits on both.
  std::function<std::unique_ptr<Backend>(int threads)> make;
  Tolerances tol;
  // Why this backend cannot run here ("" or unset: it can): a CUDA build on a machine without a
  // GPU lists the cuda backends, and their tests skip naming the reason.
  std::function<std::string()> unavailable;
};

// The reason `b` cannot run on this machine, "" when it can.
inline std::string Unavailable(const TestBackend& b) {
  return b.unavailable ? b.unavailable() : std::string();
}

#ifdef KEEL_WITH_CUDA
inline std::string CudaUnavailable() {
  const Status st = CudaDeviceAvailable();
  return st.ok() ? std::string() : "skipped, no GPU here: " + st.message();
}
#endif

inline std::unique_ptr<Backend> WithPrecision(std::unique_ptr<Backend> b, Precision p) {
  b->SetPrecision(p);
  return b;
}

inline const std::vector<TestBackend>& TestBackends() {
  static const std::vector<TestBackend> backends = {
      {"cpu", [](int threads) { return MakeCpuBackend(threads); }, Tolerances{}, {}},
      // The same backend with bf16 and fp16 products (--bf16, --fp16): every op test runs on
      // them; LayerNorm, GELU, softmax, cross-entropy and AdamW must still match fp32 exactly.
      {"cpu_bf16",
       [](int threads) { return WithPrecision(MakeCpuBackend(threads), Precision::kBf16); },
       Tolerances{1.0, 0.0, 1.5e-2, 500.0},
       {}},
      // fp16's model factor: SwiGLU and shared key/value heads compound the roundings to 0.008
      // on the reference test's logits (measured; 0.0034 in GPT-2's shape); bf16's is 5x it
      // for an 8x coarser rounding unit.
      {"cpu_fp16",
       [](int threads) { return WithPrecision(MakeCpuBackend(threads), Precision::kFp16); },
       Tolerances{1.0, 0.0, 3e-3, 100.0},
       {}},
#ifdef KEEL_WITH_CUDA
      // The CUDA backend (KEEL_CUDA builds): fp32 with the CPU's tolerances, bf16 with
      // cpu_bf16's (the same roundings of the products' operands, summed in another order).
      {"cuda", [](int) { return MakeCudaBackend(); }, Tolerances{}, CudaUnavailable},
      {"cuda_bf16", [](int) { return WithPrecision(MakeCudaBackend(), Precision::kBf16); },
       Tolerances{1.0, 0.0, 1.5e-2, 500.0}, CudaUnavailable},
#endif
      // A new backend: {"name", [](int threads) { return MakeNameBackend(); }, Tolerances{...}},
  };
  return backends;
}

// A backend that lacks one op (in one precision, or in all): the CPU backend behind a decorator
// whose Supports says no, for the tests of the check that names the op and the setting needing it.
class LackingBackend : public ProfilingBackend {
 public:
  LackingBackend(std::unique_ptr<Backend> inner, Op lacks, bool only_low_precision = false)
      : ProfilingBackend(inner.get()),
        owned_(std::move(inner)),
        lacks_(lacks),
        only_low_precision_(only_low_precision) {}
  std::string Name() const override { return "lacking"; }
  bool Supports(Op op, Precision p) const override {
    if (op == lacks_ && (!only_low_precision_ || p != Precision::kFp32)) return false;
    return ProfilingBackend::Supports(op, p);
  }

 private:
  std::unique_ptr<Backend> owned_;
  Op lacks_;
  bool only_low_precision_;
};

// GoogleTest prints parameters with this (instead of their bytes) in failure messages.
inline void PrintTo(const TestBackend& b, std::ostream* os) {
  *os << b.name;
}

}  // namespace testing_backends
}  // namespace keel

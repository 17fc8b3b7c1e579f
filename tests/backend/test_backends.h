// The backends every backend-generic test runs on, with how close each must come to the
// double-precision references. A new backend joins the op tests (backend_ops_test.cc) and the
// whole-model reference test (tests/model/gpt_reference_test.cc) with one line in TestBackends().
#pragma once

#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace keel {
namespace testing_backends {

// Tolerances per backend. The tests state the fp32 CPU backend's tolerances; `scale` multiplies
// every one of them (a reduced-precision backend, e.g. bf16, raises it instead of editing tests).
struct Tolerances {
  double scale = 1.0;
  // Relative error allowed where fp32 arithmetic is exact (Add, Scale by 1/2, embedding sums,
  // copies): 0 demands the same bits.
  double pointwise = 0.0;
};

struct TestBackend {
  std::string name;  // test-name suffix: BackendOpsTest.Matmul/cpu
  // `threads` is the parallelism to use (the CPU backend's thread count); a backend without such a
  // knob ignores it. The tests build one backend with 2 and one with 1 and demand the reductions
  // documented as thread-count independent give the same bits on both.
  std::function<std::unique_ptr<Backend>(int threads)> make;
  Tolerances tol;
};

inline const std::vector<TestBackend>& TestBackends() {
  static const std::vector<TestBackend> backends = {
      {"cpu", [](int threads) { return MakeCpuBackend(threads); }, Tolerances{}},
      // A new backend: {"cuda", [](int) { return MakeCudaBackend(); }, Tolerances{...}},
  };
  return backends;
}

// GoogleTest prints parameters with this (instead of their bytes) in failure messages.
inline void PrintTo(const TestBackend& b, std::ostream* os) {
  *os << b.name;
}

}  // namespace testing_backends
}  // namespace keel

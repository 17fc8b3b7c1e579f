// Backend op tests, run on every backend of TestBackends() (test_backends.h): every backward
// against central finite differences of its forward, forwards against naive double-precision
// loops, accumulation (+=) semantics, and bit-determinism. Data moves in and out only through the
// Backend interface (Alloc*, CopyToDevice, CopyToHost, CopyIntsToDevice, CopyIntsToHost); no test
// dereferences backend memory, so a backend with device memory runs every check unchanged.
//
// How a new backend joins: add one line to TestBackends() in test_backends.h, with its name, a
// factory and its Tolerances (the tolerances written here are the fp32 CPU backend's; `scale`
// multiplies them). Its tests then appear as Backends/BackendOpsTest.*/<name>, and the whole-model
// reference test (tests/model/gpt_reference_test.cc) runs on it too. Checks of one backend's own
// choices (the CPU's BLAS kernels, alignment, Describe) go in that backend's file, e.g.
// cpu_backend_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "test_backends.h"

namespace keel {
namespace {

using testing_backends::TestBackend;
using testing_backends::TestBackends;

// A backend buffer that frees itself. Its contents move only through the backend's copies.
template <typename T>
class Buf {
 public:
  Buf(Backend* be, size_t n) : be_(be), n_(n) {
    if constexpr (std::is_same_v<T, float>) {
      p_ = be->AllocFloats(n);
    } else {
      p_ = be->AllocInts(n);
    }
  }
  Buf(Backend* be, const std::vector<T>& v) : Buf(be, v.size()) { Set(v); }
  ~Buf() { be_->Free(p_); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;

  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }

  // A host copy of the whole buffer. (Empty buffers copy nothing: memcpy must not see null.)
  std::vector<T> vec() const {
    std::vector<T> v(n_);
    if (n_ == 0) return v;
    if constexpr (std::is_same_v<T, float>) {
      be_->CopyToHost(v.data(), p_, n_);
    } else {
      be_->CopyIntsToHost(v.data(), p_, n_);
    }
    return v;
  }
  void Set(const std::vector<T>& v) {
    if (v.size() != n_) throw std::logic_error("Buf::Set: size mismatch");
    if (n_ == 0) return;
    if constexpr (std::is_same_v<T, float>) {
      be_->CopyToDevice(p_, v.data(), n_);
    } else {
      be_->CopyIntsToDevice(p_, v.data(), n_);
    }
  }
  // One element (finite differences perturb one input at a time).
  void SetAt(size_t i, T x) {
    static_assert(std::is_same_v<T, float>);
    be_->CopyToDevice(p_ + i, &x, 1);
  }

 private:
  Backend* be_;
  T* p_;
  size_t n_;
};
using Floats = Buf<float>;
using Ints = Buf<int32_t>;

std::vector<float> RandomVec(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<float> v(n);
  for (float& x : v) x = lo + (hi - lo) * static_cast<float>(g() >> 8) * (1.0f / (1 << 24));
  return v;
}

// L = sum_i out[i] * r[i], accumulated in double.
double Weighted(const Floats& out, const std::vector<float>& r) {
  const std::vector<float> o = out.vec();
  double s = 0.0;
  for (size_t i = 0; i < r.size(); i++) s += double(o[i]) * r[i];
  return s;
}

// For each index i, compares grad[i] with the central difference (L(x+eps) - L(x-eps)) / 2eps,
// where loss() evaluates L with the current contents of x. All elements when indices is empty.
void ExpectGradMatchesFiniteDiff(const char* what, Floats& x, const std::vector<float>& grad,
                                 const std::function<double()>& loss, float eps, double tol,
                                 std::vector<size_t> indices = {}) {
  if (indices.empty()) {
    for (size_t i = 0; i < x.size(); i++) indices.push_back(i);
  }
  const std::vector<float> host = x.vec();
  for (size_t i : indices) {
    const float orig = host[i];
    const float up = orig + eps, down = orig - eps;
    x.SetAt(i, up);
    const double lp = loss();
    x.SetAt(i, down);
    const double lm = loss();
    x.SetAt(i, orig);
    const double numeric = (lp - lm) / (double(up) - double(down));
    EXPECT_NEAR(grad[i], numeric, tol * std::max(1.0, std::abs(numeric)))
        << what << "[" << i << "]";
  }
}

void ExpectAllNear(const std::vector<float>& got, const std::vector<double>& want, double tol,
                   const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); i++) {
    EXPECT_NEAR(got[i], want[i], tol * std::max(1.0, std::abs(want[i]))) << what << "[" << i << "]";
  }
}

// twice == 2 * once to within rounding: a backward run twice doubles its gradient (+= semantics).
void ExpectDoubled(const std::vector<float>& once, const std::vector<float>& twice, double tol,
                   const char* what) {
  ASSERT_EQ(once.size(), twice.size());
  for (size_t i = 0; i < once.size(); i++) {
    EXPECT_NEAR(twice[i], 2.0f * once[i], tol * std::max(1.0f, std::abs(2.0f * once[i])))
        << what << "[" << i << "]";
  }
}

bool SameBits(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}
bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && SameBits(a.data(), b.data(), a.size());
}

class BackendOpsTest : public ::testing::TestWithParam<TestBackend> {
 protected:
  // Made here rather than in an initialiser, so a backend this machine lacks (CUDA without a GPU)
  // skips naming why instead of failing.
  void SetUp() override {
    const std::string why = testing_backends::Unavailable(GetParam());
    if (!why.empty()) GTEST_SKIP() << why;
    be_ = GetParam().make(2);
  }
  std::unique_ptr<Backend> be_;
  Backend* be() { return be_.get(); }
  // A tolerance written for the fp32 CPU backend, scaled for this backend.
  double Tol(double fp32_tol) const { return fp32_tol * GetParam().tol.scale; }
  // Mixed precision: the relative tolerance of products against exact references (0 in fp32).
  double Products() const { return GetParam().tol.products; }
  // Values fp32 computes exactly (sums and copies of floats): the same bits unless the backend's
  // tolerances allow a relative error for them.
  void ExpectPointwise(const std::vector<float>& got, const std::vector<float>& want,
                       const char* what) const {
    ASSERT_EQ(got.size(), want.size());
    const double tol = GetParam().tol.pointwise;
    for (size_t i = 0; i < got.size(); i++) {
      if (tol == 0.0) {
        EXPECT_EQ(got[i], want[i]) << what << "[" << i << "]";
      } else {
        EXPECT_NEAR(got[i], want[i], tol * std::max(1.0f, std::abs(want[i])))
            << what << "[" << i << "]";
      }
    }
  }
};

TEST_P(BackendOpsTest, AllocIsZeroed) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{17}, size_t{1000}}) {
    Floats f(be(), n);
    Ints k(be(), n);
    EXPECT_EQ(f.vec(), std::vector<float>(n, 0.0f));
    EXPECT_EQ(k.vec(), std::vector<int32_t>(n, 0));
  }
}

TEST_P(BackendOpsTest, CopiesAndPointwise) {
  const size_t n = 1000;
  const std::vector<float> a = RandomVec(n, -1, 1, 1), b = RandomVec(n, -1, 1, 2);
  Floats da(be(), n), db(be(), n), out(be(), n);
  be_->CopyToDevice(da.data(), a.data(), n);
  be_->CopyToDevice(db.data(), b.data(), n);
  std::vector<float> sum(n), sum2(n), half(n);
  for (size_t i = 0; i < n; i++) {
    sum[i] = a[i] + b[i];
    sum2[i] = (a[i] + b[i]) + b[i];
    half[i] = b[i] * 0.5f;
  }
  be_->Add(out.data(), da.data(), db.data(), n);
  ExpectPointwise(out.vec(), sum, "add");
  be_->Add(da.data(), da.data(), db.data(), n);  // out aliases a
  ExpectPointwise(da.vec(), sum, "add in place");
  be_->Accumulate(out.data(), db.data(), n);
  ExpectPointwise(out.vec(), sum2, "accumulate");
  be_->Scale(db.data(), n, 0.5f);
  ExpectPointwise(db.vec(), half, "scale");
  be_->Copy(out.data(), db.data(), n);
  std::vector<float> host(n);
  be_->CopyToHost(host.data(), out.data(), n);
  ExpectPointwise(host, half, "copy");
  // A host view, zero-copy or staged, holds what a copy to the host returns; so does the
  // base class's staged view, which a backend without host memory inherits.
  const HostView view = be_->ViewOnHost(out.data(), n);
  ASSERT_EQ(view.size(), n);
  EXPECT_TRUE(SameBits(view.data(), host.data(), n));
  const HostView staged = be_->Backend::ViewOnHost(out.data(), n);
  EXPECT_FALSE(staged.zero_copy());
  EXPECT_NE(staged.data(), out.data());
  EXPECT_TRUE(SameBits(staged.data(), host.data(), n));
  be_->Synchronize();
  be_->Zero(out.data(), n);
  EXPECT_EQ(out.vec(), std::vector<float>(n, 0.0f));
  const std::vector<int32_t> ints = {3, -1, 7};
  Ints di(be(), 3);
  be_->CopyIntsToDevice(di.data(), ints.data(), 3);
  std::vector<int32_t> back(3);
  be_->CopyIntsToHost(back.data(), di.data(), 3);
  EXPECT_EQ(back, ints);
}

// ---- embeddings -----------------------------------------------------------------------------

TEST_P(BackendOpsTest, Embedding) {
  const int B = 2, T = 5, C = 8, V = 7;
  const std::vector<int32_t> tok = {1, 3, 3, 0, 6, 3, 1, 2, 3, 5};  // repeats accumulate
  Ints tokens(be(), tok);
  for (bool with_wpe : {true, false}) {
    SCOPED_TRACE(with_wpe ? "with wpe" : "without wpe");
    const std::vector<float> hwte = RandomVec(V * C, -1, 1, 3), hwpe = RandomVec(T * C, -1, 1, 4);
    Floats wte(be(), hwte), wpe(be(), hwpe);
    float* wpe_p = with_wpe ? wpe.data() : nullptr;
    Floats out(be(), B * T * C);
    be_->EmbeddingForward(out.data(), tokens.data(), wte.data(), wpe_p, B, T, C, V);
    std::vector<float> want(B * T * C);
    for (int bt = 0; bt < B * T; bt++) {
      for (int c = 0; c < C; c++) {
        want[bt * C + c] = hwte[tok[bt] * C + c] + (with_wpe ? hwpe[(bt % T) * C + c] : 0.0f);
      }
    }
    ExpectPointwise(out.vec(), want, "out");
    const std::vector<float> r = RandomVec(B * T * C, -1, 1, 5);
    Floats dout(be(), r), dwte(be(), V * C), dwpe(be(), T * C);
    be_->EmbeddingBackward(dwte.data(), with_wpe ? dwpe.data() : nullptr, dout.data(),
                           tokens.data(), B, T, C, V);
    auto loss = [&] {
      be_->EmbeddingForward(out.data(), tokens.data(), wte.data(), wpe_p, B, T, C, V);
      return Weighted(out, r);
    };
    ExpectGradMatchesFiniteDiff("dwte", wte, dwte.vec(), loss, 1e-2f, Tol(2e-3));
    if (with_wpe) {
      ExpectGradMatchesFiniteDiff("dwpe", wpe, dwpe.vec(), loss, 1e-2f, Tol(2e-3));
    } else {
      EXPECT_EQ(dwpe.vec(), std::vector<float>(T * C, 0.0f));  // untouched when dwpe is null
    }
    // Accumulation: a second backward doubles the gradients.
    const std::vector<float> dwte1 = dwte.vec(), dwpe1 = dwpe.vec();
    be_->EmbeddingBackward(dwte.data(), with_wpe ? dwpe.data() : nullptr, dout.data(),
                           tokens.data(), B, T, C, V);
    ExpectDoubled(dwte1, dwte.vec(), Tol(1e-6), "dwte");
    if (with_wpe) ExpectDoubled(dwpe1, dwpe.vec(), Tol(1e-6), "dwpe");
  }
}

// A token outside the table (a huge id, one just past it, a negative one) is an error raised
// before any row is read or written: never a wild access, never a partly updated gradient.
TEST_P(BackendOpsTest, EmbeddingRefusesTokensOutsideTheTable) {
  const int B = 1, T = 4, C = 8, V = 7;
  Floats wte(be(), RandomVec(V * C, -1, 1, 3)), wpe(be(), RandomVec(T * C, -1, 1, 4));
  for (int32_t id : {2000000000, V, -1}) {
    SCOPED_TRACE(id);
    Ints tokens(be(), std::vector<int32_t>{1, 2, id, 3});
    const std::vector<float> before = RandomVec(B * T * C, -1, 1, 5);
    Floats out(be(), before), dwte(be(), V * C), dwpe(be(), T * C), dout(be(), before);
    EXPECT_THROW(
        be_->EmbeddingForward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C, V),
        KeelError);
    EXPECT_EQ(out.vec(), before);
    EXPECT_THROW(
        be_->EmbeddingBackward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C, V),
        KeelError);
    EXPECT_EQ(dwte.vec(), std::vector<float>(V * C, 0.0f));
    EXPECT_EQ(dwpe.vec(), std::vector<float>(T * C, 0.0f));
  }
}

// ---- layer norm -----------------------------------------------------------------------------

TEST_P(BackendOpsTest, LayerNorm) {
  const int N = 10, C = 8;
  const float eps = 1e-5f;
  const std::vector<float> hinp = RandomVec(N * C, -2, 3, 6), hw = RandomVec(C, 0.5, 1.5, 7),
                           hb = RandomVec(C, -0.5, 0.5, 8);
  Floats inp(be(), hinp), w(be(), hw), b(be(), hb);
  Floats out(be(), N * C), mean(be(), N), rstd(be(), N);
  be_->LayerNormForward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C,
                        eps);
  // Forward against a double reference.
  std::vector<double> want(N * C), want_mean(N), want_rstd(N);
  for (int n = 0; n < N; n++) {
    double m = 0, var = 0;
    for (int c = 0; c < C; c++) m += hinp[n * C + c];
    m /= C;
    for (int c = 0; c < C; c++) var += (hinp[n * C + c] - m) * (hinp[n * C + c] - m);
    var /= C;
    const double s = 1.0 / std::sqrt(var + eps);
    for (int c = 0; c < C; c++) want[n * C + c] = (hinp[n * C + c] - m) * s * hw[c] + hb[c];
    want_mean[n] = m;
    want_rstd[n] = s;
  }
  ExpectAllNear(out.vec(), want, Tol(1e-5), "out");
  ExpectAllNear(mean.vec(), want_mean, Tol(1e-5), "mean");
  ExpectAllNear(rstd.vec(), want_rstd, Tol(1e-5), "rstd");

  const std::vector<float> r = RandomVec(N * C, -1, 1, 9);
  Floats dout(be(), r), dinp(be(), N * C), dw(be(), C), db(be(), C);
  be_->LayerNormBackward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(),
                         mean.data(), rstd.data(), N, C);
  Floats out2(be(), N * C), mean2(be(), N), rstd2(be(), N);
  auto loss = [&] {
    be_->LayerNormForward(out2.data(), mean2.data(), rstd2.data(), inp.data(), w.data(), b.data(),
                          N, C, eps);
    return Weighted(out2, r);
  };
  ExpectGradMatchesFiniteDiff("dinp", inp, dinp.vec(), loss, 1e-3f, Tol(2e-3));
  ExpectGradMatchesFiniteDiff("dweight", w, dw.vec(), loss, 1e-3f, Tol(2e-3));
  ExpectGradMatchesFiniteDiff("dbias", b, db.vec(), loss, 1e-3f, Tol(2e-3));

  const std::vector<float> dinp1 = dinp.vec(), dw1 = dw.vec(), db1 = db.vec();
  be_->LayerNormBackward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(),
                         mean.data(), rstd.data(), N, C);
  ExpectDoubled(dinp1, dinp.vec(), Tol(1e-6), "dinp");
  ExpectDoubled(dw1, dw.vec(), Tol(1e-6), "dweight");
  ExpectDoubled(db1, db.vec(), Tol(1e-6), "dbias");
}

// ---- linear layer ---------------------------------------------------------------------------

TEST_P(BackendOpsTest, Matmul) {
  const int N = 10, IC = 8, OC = 6;
  for (bool with_bias : {true, false}) {
    SCOPED_TRACE(with_bias ? "with bias" : "without bias");
    const std::vector<float> hinp = RandomVec(N * IC, -1, 1, 10),
                             hw = RandomVec(OC * IC, -1, 1, 11), hbias = RandomVec(OC, -1, 1, 12);
    Floats inp(be(), hinp), w(be(), hw), bias(be(), hbias);
    float* bias_p = with_bias ? bias.data() : nullptr;
    Floats out(be(), N * OC);
    be_->MatmulForward(out.data(), inp.data(), w.data(), bias_p, N, IC, OC);
    std::vector<double> want(N * OC);
    for (int n = 0; n < N; n++) {
      for (int o = 0; o < OC; o++) {
        double s = with_bias ? hbias[o] : 0.0;
        for (int i = 0; i < IC; i++) s += double(hinp[n * IC + i]) * hw[o * IC + i];
        want[n * OC + o] = s;
      }
    }
    ExpectAllNear(out.vec(), want, Products() > 0 ? Products() : Tol(1e-5), "out");

    const std::vector<float> r = RandomVec(N * OC, -1, 1, 13);
    Floats dout(be(), r), dinp(be(), N * IC), dw(be(), OC * IC), db(be(), OC);
    be_->MatmulBackward(dinp.data(), dw.data(), with_bias ? db.data() : nullptr, dout.data(),
                        inp.data(), w.data(), N, IC, OC);
    if (Products() > 0) {
      // Rounded operands make the forward a staircase: compare with the exact gradients instead.
      std::vector<double> want_dinp(N * IC, 0.0), want_dw(OC * IC, 0.0), want_db(OC, 0.0);
      for (int n = 0; n < N; n++) {
        for (int o = 0; o < OC; o++) {
          const double d = r[n * OC + o];
          want_db[o] += d;
          for (int i = 0; i < IC; i++) {
            want_dinp[n * IC + i] += d * hw[o * IC + i];
            want_dw[o * IC + i] += d * hinp[n * IC + i];
          }
        }
      }
      ExpectAllNear(dinp.vec(), want_dinp, Products(), "dinp");
      ExpectAllNear(dw.vec(), want_dw, Products(), "dweight");
      if (with_bias) ExpectAllNear(db.vec(), want_db, Tol(1e-5), "dbias");  // fp32 sums
    } else {
      auto loss = [&] {
        be_->MatmulForward(out.data(), inp.data(), w.data(), bias_p, N, IC, OC);
        return Weighted(out, r);
      };
      ExpectGradMatchesFiniteDiff("dinp", inp, dinp.vec(), loss, 1e-2f, Tol(2e-3));
      ExpectGradMatchesFiniteDiff("dweight", w, dw.vec(), loss, 1e-2f, Tol(2e-3));
      if (with_bias) ExpectGradMatchesFiniteDiff("dbias", bias, db.vec(), loss, 1e-2f, Tol(2e-3));
    }

    const std::vector<float> dinp1 = dinp.vec(), dw1 = dw.vec(), db1 = db.vec();
    be_->MatmulBackward(dinp.data(), dw.data(), with_bias ? db.data() : nullptr, dout.data(),
                        inp.data(), w.data(), N, IC, OC);
    ExpectDoubled(dinp1, dinp.vec(), Tol(1e-6), "dinp");
    ExpectDoubled(dw1, dw.vec(), Tol(1e-6), "dweight");
    if (with_bias) ExpectDoubled(db1, db.vec(), Tol(1e-6), "dbias");
  }
  // dinp may be null (the first layer needs no input gradient).
  Floats inp(be(), RandomVec(N * IC, -1, 1, 14)), w(be(), RandomVec(OC * IC, -1, 1, 15));
  Floats dout(be(), RandomVec(N * OC, -1, 1, 16)), dw(be(), OC * IC), dw_ref(be(), OC * IC),
      dinp(be(), N * IC);
  be_->MatmulBackward(nullptr, dw.data(), nullptr, dout.data(), inp.data(), w.data(), N, IC, OC);
  be_->MatmulBackward(dinp.data(), dw_ref.data(), nullptr, dout.data(), inp.data(), w.data(), N, IC,
                      OC);
  EXPECT_TRUE(SameBits(dw.vec(), dw_ref.vec()));
}

// The step's first micro-batch writes the weight and bias gradients (add_to_dweight false): the
// same values as adding to zeros, whatever the buffers held before; dinp still accumulates.
TEST_P(BackendOpsTest, MatmulBackwardCanOverwriteTheWeightGradient) {
  const int N = 64, IC = 48, OC = 40;
  Floats inp(be(), RandomVec(N * IC, -1, 1, 30)), w(be(), RandomVec(OC * IC, -1, 1, 31));
  Floats dout(be(), RandomVec(N * OC, -1, 1, 32));
  const std::vector<float> old_dinp = RandomVec(N * IC, -1, 1, 33);
  Floats dinp_add(be(), old_dinp), dw_add(be(), OC * IC), db_add(be(), OC);
  Floats dinp_set(be(), old_dinp), dw_set(be(), std::vector<float>(OC * IC, 7.0f)),
      db_set(be(), std::vector<float>(OC, -3.0f));
  be_->MatmulBackward(dinp_add.data(), dw_add.data(), db_add.data(), dout.data(), inp.data(),
                      w.data(), N, IC, OC);
  be_->MatmulBackward(dinp_set.data(), dw_set.data(), db_set.data(), dout.data(), inp.data(),
                      w.data(), N, IC, OC, nullptr, /*add_to_dweight=*/false);
  EXPECT_EQ(dw_set.vec(), dw_add.vec());
  EXPECT_EQ(db_set.vec(), db_add.vec());
  EXPECT_EQ(dinp_set.vec(), dinp_add.vec());  // accumulated onto old_dinp in both
  EXPECT_NE(dinp_set.vec(), old_dinp);
}

// The products read operands rounded to the backend's precision, accumulate in fp32, and (fp16)
// store fp16 outputs: 1 + 2^-12 is 1 in bf16 and fp16 but not in fp32; 300 * 300 = 90000 is past
// fp16's largest finite value 65504. A weight converted once (ToLowPrecision) gives the same bits.
TEST_P(BackendOpsTest, ProductsComputeInTheBackendsPrecision) {
  const Precision p = be_->precision();
  const int N = 3, IC = 8, OC = 2;
  const float x = 1.0f + std::ldexp(1.0f, -12);
  Floats inp(be(), std::vector<float>(N * IC, x)), w(be(), std::vector<float>(OC * IC, x));
  Floats out(be(), N * OC);
  be_->MatmulForward(out.data(), inp.data(), w.data(), nullptr, N, IC, OC);
  const float want = p == Precision::kFp32 ? static_cast<float>(IC * double(x) * x) : float(IC);
  for (float v : out.vec()) EXPECT_FLOAT_EQ(v, want);
  if (p == Precision::kFp32) {
    EXPECT_NE(want, float(IC));
  } else {
    uint16_t* bits = be_->AllocHalves(OC * IC);
    be_->ToLowPrecision(bits, w.data(), OC * IC);
    Floats out2(be(), N * OC);
    be_->MatmulForward(out2.data(), inp.data(), w.data(), nullptr, N, IC, OC, bits);
    EXPECT_TRUE(SameBits(out.vec(), out2.vec()));
    Floats dout(be(), std::vector<float>(N * OC, 0.5f)), d1(be(), N * IC), d2(be(), N * IC),
        dw1(be(), OC * IC), dw2(be(), OC * IC);
    be_->MatmulBackward(d1.data(), dw1.data(), nullptr, dout.data(), inp.data(), w.data(), N, IC,
                        OC);
    be_->MatmulBackward(d2.data(), dw2.data(), nullptr, dout.data(), inp.data(), w.data(), N, IC,
                        OC, bits);
    EXPECT_TRUE(SameBits(d1.vec(), d2.vec()));
    EXPECT_TRUE(SameBits(dw1.vec(), dw2.vec()));
    for (float v : d1.vec()) EXPECT_FLOAT_EQ(v, OC * 0.5f);  // 0.5 * rounded x, summed
    be_->Free(bits);
  }
  // Range: an fp16 output overflows to inf, as on a GPU; bf16 and fp32 outputs are fp32.
  Floats big_a(be(), std::vector<float>(1, 300.0f)), big_w(be(), std::vector<float>(1, 300.0f));
  Floats big(be(), 1);
  be_->MatmulForward(big.data(), big_a.data(), big_w.data(), nullptr, 1, 1, 1);
  if (p == Precision::kFp16) {
    EXPECT_TRUE(std::isinf(big.vec()[0]));
  } else {
    EXPECT_EQ(big.vec()[0], 90000.0f);
  }
  // RoundToStorage rounds only in fp16.
  Floats act(be(), std::vector<float>{x, 1e5f});
  be_->RoundToStorage(act.data(), 2);
  const std::vector<float> a = act.vec();
  EXPECT_EQ(a[0], p == Precision::kFp16 ? 1.0f : x);
  EXPECT_EQ(std::isinf(a[1]), p == Precision::kFp16);
}

// ---- causal self-attention ------------------------------------------------------------------

// Double-precision reference: q and k scaled by hs^-1/4, ALiBi bias, causal softmax, P v.
// Also returns the probabilities in att (B,NH,T,T) when att is not null.
// qkv rows are (NH + 2G) hs wide: NH query heads, G key heads, G value heads (G = NH: MHA).
std::vector<double> ReferenceAttention(const std::vector<float>& qkv, const float* slopes, int B,
                                       int T, int C, int NH, std::vector<double>* att, int G = 0) {
  const int hs = C / NH;
  if (G == 0) G = NH;
  const size_t W = size_t(NH + 2 * G) * hs;
  const double a = std::pow(double(hs), -0.25);
  std::vector<double> out(size_t(B) * T * C, 0.0);
  if (att != nullptr) att->assign(size_t(B) * NH * T * T, 0.0);
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      for (int i = 0; i < T; i++) {
        const float* q = &qkv[(size_t(b) * T + i) * W + h * hs];
        const int g = h / (NH / G);  // the key/value head of query head h
        std::vector<double> s(i + 1);
        double mx = -INFINITY;
        for (int j = 0; j <= i; j++) {
          const float* k = &qkv[(size_t(b) * T + j) * W + (NH + g) * hs];
          double dot = 0;
          for (int d = 0; d < hs; d++) dot += (a * q[d]) * (a * k[d]);
          s[j] = dot - (slopes ? slopes[h] * double(i - j) : 0.0);
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int j = 0; j <= i; j++) sum += (s[j] = std::exp(s[j] - mx));
        for (int j = 0; j <= i; j++) {
          const double p = s[j] / sum;
          if (att != nullptr) (*att)[((size_t(b) * NH + h) * T + i) * T + j] = p;
          const float* v = &qkv[(size_t(b) * T + j) * W + (NH + G + g) * hs];
          for (int d = 0; d < hs; d++) out[(size_t(b) * T + i) * C + h * hs + d] += p * v[d];
        }
      }
    }
  }
  return out;
}

// `slopes` (NH, host) empty: no ALiBi. `scale` multiplies the fp32 tolerances; `products` > 0
// (mixed precision) replaces them for outputs and gradients, which are then checked against the
// double reference's own finite differences.
// G: key/value heads (0: one per query head).
void CheckAttention(Backend* be, double scale, double products, int B, int T, int C, int NH,
                    const std::vector<float>& slopes, bool all_grads, int G = 0) {
  const float* host_slopes = slopes.empty() ? nullptr : slopes.data();
  Floats dev_slopes(be, slopes);
  const float* slopes_p = slopes.empty() ? nullptr : dev_slopes.data();
  const int hs = C / NH, groups = G > 0 ? G : NH;
  const int W = (NH + 2 * groups) * hs;
  const std::vector<float> hqkv = RandomVec(size_t(B) * T * W, -2, 2, 17 + T);
  Floats qkv(be, hqkv);
  Floats out(be, size_t(B) * T * C), att(be, size_t(B) * NH * T * T), mx(be, size_t(B) * NH);
  be->AttentionForward(out.data(), att.data(), qkv.data(), slopes_p, B, T, C, NH, mx.data(),
                       nullptr, G);

  // The max pre-softmax score per (b, h), brute force in double.
  const double a = std::pow(double(hs), -0.25);
  const std::vector<float> hmx = mx.vec();
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      double want_max = -1e300;
      for (int i = 0; i < T; i++)
        for (int j = 0; j <= i; j++) {
          double d = 0;
          for (int k = 0; k < hs; k++)
            d += a * hqkv[(size_t(b) * T + i) * W + h * hs + k] * a *
                 hqkv[(size_t(b) * T + j) * W + (NH + h / (NH / groups)) * hs + k];
          if (host_slopes != nullptr) d -= host_slopes[h] * (i - j);
          want_max = std::max(want_max, d);
        }
      EXPECT_NEAR(hmx[size_t(b) * NH + h], want_max,
                  (products > 0 ? products : scale * 1e-4) * (1 + std::fabs(want_max)))
          << "max logit of sequence " << b << " head " << h;
    }

  std::vector<double> want_att;
  const std::vector<double> want = ReferenceAttention(hqkv, host_slopes, B, T, C, NH, &want_att, G);
  const std::vector<float> hout = out.vec(), hatt = att.vec();
  const double out_tol = products > 0 ? products : scale * 2e-5;
  ExpectAllNear(hout, want, out_tol, "out");
  ExpectAllNear(hatt, want_att, out_tol, "att");  // includes exact zeros above the diagonal
  for (size_t bhi = 0; bhi < size_t(B) * NH * T; bhi++) {
    const int i = bhi % T;
    for (int j = i + 1; j < T; j++) ASSERT_EQ(hatt[bhi * T + j], 0.0f);
  }

  // Causality: changing token j (its q, k and v) leaves output rows i < j bit-identical.
  {
    Floats out2(be, out.size()), att2(be, att.size());
    for (int j : {1, T / 2, T - 1}) {
      std::vector<float> changed_qkv = hqkv;
      for (int b = 0; b < B; b++) {
        for (int c = 0; c < W; c++) changed_qkv[(size_t(b) * T + j) * W + c] += 0.75f;
      }
      qkv.Set(changed_qkv);
      be->AttentionForward(out2.data(), att2.data(), qkv.data(), slopes_p, B, T, C, NH, nullptr,
                           nullptr, G);
      qkv.Set(hqkv);
      const std::vector<float> hout2 = out2.vec();
      for (int b = 0; b < B; b++) {
        EXPECT_TRUE(SameBits(hout.data() + size_t(b) * T * C, hout2.data() + size_t(b) * T * C,
                             size_t(j) * C))
            << "rows before token " << j << " changed";
      }
      bool changed = false;
      for (int c = 0; c < C; c++) changed |= hout[size_t(j) * C + c] != hout2[size_t(j) * C + c];
      EXPECT_TRUE(changed) << "row " << j << " does not depend on its own token";
    }
  }

  // Gradient against finite differences of sum(out * r).
  const std::vector<float> r = RandomVec(out.size(), -1, 1, 18);
  Floats dout(be, r), dqkv(be, qkv.size());
  be->AttentionBackward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH, G);
  Floats out2(be, out.size()), att2(be, att.size());
  auto loss = [&] {
    be->AttentionForward(out2.data(), att2.data(), qkv.data(), slopes_p, B, T, C, NH, nullptr,
                         nullptr, G);
    return Weighted(out2, r);
  };
  // Long sequences: a subset of elements, differentiating the double reference (many small
  // multi-threaded calls are slow on a shared machine, and the reference is exact enough).
  auto reference_loss = [&] {
    const std::vector<double> o =
        ReferenceAttention(qkv.vec(), host_slopes, B, T, C, NH, nullptr, G);
    double s = 0;
    for (size_t i = 0; i < o.size(); i++) s += o[i] * r[i];
    return s;
  };
  std::vector<size_t> idx;
  if (!all_grads) {
    for (size_t i = 0; i < qkv.size(); i += 53) idx.push_back(i);
  }
  const bool own_forward = all_grads && products == 0;
  ExpectGradMatchesFiniteDiff("dqkv", qkv, dqkv.vec(),
                              own_forward ? std::function<double()>(loss) : reference_loss, 1e-2f,
                              products > 0 ? products : scale * 2e-3, idx);

  const std::vector<float> d1 = dqkv.vec();
  be->AttentionBackward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH, G);
  ExpectDoubled(d1, dqkv.vec(), scale * 1e-6, "dqkv");
}

TEST_P(BackendOpsTest, Attention) {
  CheckAttention(be(), Tol(1), Products(), 2, 5, 8, 2, {}, true);
}

TEST_P(BackendOpsTest, AttentionAlibi) {
  CheckAttention(be(), Tol(1), Products(), 2, 5, 8, 2, {0.5f, 0.125f}, true);
}

// T spans several 64-row blocks, the last one partial.
TEST_P(BackendOpsTest, AttentionLongSequence) {
  CheckAttention(be(), Tol(1), Products(), 1, 150, 16, 2, {}, false);
  CheckAttention(be(), Tol(1), Products(), 2, 130, 16, 2, {0.25f, 0.0625f}, false);
}

// Grouped-query attention: 4 query heads over 2 and over 1 key/value heads (a key/value head's
// gradient sums over the query heads it serves).
TEST_P(BackendOpsTest, AttentionGroupedQuery) {
  CheckAttention(be(), Tol(1), Products(), 2, 5, 16, 4, {}, true, 2);
  CheckAttention(be(), Tol(1), Products(), 2, 5, 16, 4, {0.5f, 0.25f, 0.125f, 0.0625f}, true, 1);
  CheckAttention(be(), Tol(1), Products(), 1, 130, 16, 4, {}, false, 2);
}

// ---- rotary position embedding ---------------------------------------------------------------

// RoPE on a [q (NH) | k (G) | v (G)] layout, partial rotary, with and without position ids:
// against the rotation written out in double, its backward against finite differences (it is
// the transpose), and forward then backward gives back the input (a rotation).
TEST_P(BackendOpsTest, Rope) {
  const int B = 2, T = 5, NH = 4, G = 2, hs = 6, W = (NH + 2 * G) * hs, P = 8;
  const double base = 50;
  for (int rot : {6, 4}) {
    SCOPED_TRACE("rot " + std::to_string(rot));
    std::vector<float> table(size_t(P) * rot);
    for (int p = 0; p < P; p++)
      for (int i = 0; i < rot / 2; i++) {
        const double th = p * std::pow(base, -2.0 * i / rot);
        table[size_t(p) * rot + i] = static_cast<float>(std::cos(th));
        table[size_t(p) * rot + rot / 2 + i] = static_cast<float>(std::sin(th));
      }
    Floats cs(be(), table);
    const std::vector<int32_t> hpos = {0, 1, 2, 0, 1, 7, 6, 5, 4, 3};  // restarted, reversed
    Ints pos(be(), hpos);
    for (bool with_pos : {false, true}) {
      SCOPED_TRACE(with_pos ? "position ids" : "t");
      const std::vector<float> hx = RandomVec(size_t(B) * T * W, -2, 2, 31 + rot);
      Floats x(be(), hx);
      be_->RopeForward(x.data(), cs.data(), with_pos ? pos.data() : nullptr, B, T, NH, G, hs, rot);
      std::vector<double> want(hx.begin(), hx.end());
      for (int n = 0; n < B * T; n++) {
        const int p = with_pos ? hpos[n] : n % T;
        for (int h = 0; h < NH + G; h++) {  // query and key heads; v untouched
          double* v = &want[size_t(n) * W + h * hs];
          for (int i = 0; i < rot / 2; i++) {
            const double th = p * std::pow(base, -2.0 * i / rot);
            const double x1 = v[i], x2 = v[i + rot / 2];
            v[i] = x1 * std::cos(th) - x2 * std::sin(th);
            v[i + rot / 2] = x2 * std::cos(th) + x1 * std::sin(th);
          }
        }
      }
      ExpectAllNear(x.vec(), want, Tol(1e-6), "rope");
      // Backward: d/dx of sum(rope(x) * r) is the turned-back r.
      const std::vector<float> r = RandomVec(hx.size(), -1, 1, 32);
      Floats g(be(), r), in(be(), hx), y(be(), hx.size());
      be_->RopeBackward(g.data(), cs.data(), with_pos ? pos.data() : nullptr, B, T, NH, G, hs, rot);
      auto loss = [&] {
        y.Set(in.vec());
        be_->RopeForward(y.data(), cs.data(), with_pos ? pos.data() : nullptr, B, T, NH, G, hs,
                         rot);
        return Weighted(y, r);
      };
      std::vector<size_t> idx;
      for (size_t i = 0; i < hx.size(); i += 7) idx.push_back(i);
      ExpectGradMatchesFiniteDiff("dx", in, g.vec(), loss, 1e-2f, Tol(1e-3), idx);
      // A rotation: turning back restores the input (to rounding).
      be_->RopeBackward(x.data(), cs.data(), with_pos ? pos.data() : nullptr, B, T, NH, G, hs, rot);
      std::vector<double> orig(hx.begin(), hx.end());
      ExpectAllNear(x.vec(), orig, Tol(1e-6), "rope^T rope");
    }
  }
}

// ---- RMSNorm ----------------------------------------------------------------------------------

TEST_P(BackendOpsTest, RmsNorm) {
  const int N = 10, C = 8;
  const float eps = 1e-5f;
  const std::vector<float> hinp = RandomVec(N * C, -2, 3, 46), hw = RandomVec(C, 0.5, 1.5, 47);
  Floats inp(be(), hinp), w(be(), hw);
  Floats out(be(), N * C), rstd(be(), N);
  be_->RmsNormForward(out.data(), rstd.data(), inp.data(), w.data(), N, C, eps);
  std::vector<double> want(N * C), want_rstd(N);
  for (int n = 0; n < N; n++) {
    double ms = 0;
    for (int c = 0; c < C; c++) ms += double(hinp[n * C + c]) * hinp[n * C + c];
    const double s = 1.0 / std::sqrt(ms / C + eps);
    for (int c = 0; c < C; c++) want[n * C + c] = hinp[n * C + c] * s * hw[c];
    want_rstd[n] = s;
  }
  ExpectAllNear(out.vec(), want, Tol(1e-5), "out");
  ExpectAllNear(rstd.vec(), want_rstd, Tol(1e-5), "rstd");

  const std::vector<float> r = RandomVec(N * C, -1, 1, 48);
  Floats dout(be(), r), dinp(be(), N * C), dw(be(), C);
  be_->RmsNormBackward(dinp.data(), dw.data(), dout.data(), inp.data(), w.data(), rstd.data(), N,
                       C);
  Floats out2(be(), N * C), rstd2(be(), N);
  auto loss = [&] {
    be_->RmsNormForward(out2.data(), rstd2.data(), inp.data(), w.data(), N, C, eps);
    return Weighted(out2, r);
  };
  ExpectGradMatchesFiniteDiff("dinp", inp, dinp.vec(), loss, 1e-3f, Tol(2e-3));
  ExpectGradMatchesFiniteDiff("dweight", w, dw.vec(), loss, 1e-3f, Tol(2e-3));

  const std::vector<float> dinp1 = dinp.vec(), dw1 = dw.vec();
  be_->RmsNormBackward(dinp.data(), dw.data(), dout.data(), inp.data(), w.data(), rstd.data(), N,
                       C);
  ExpectDoubled(dinp1, dinp.vec(), Tol(1e-6), "dinp");
  ExpectDoubled(dw1, dw.vec(), Tol(1e-6), "dweight");
}

// ---- pointwise ------------------------------------------------------------------------------

// SwiGLU over rows [g | u]: silu(g) * u against double, the backward against finite differences
// (every element: g and u, both halves), += semantics; large |g| stays finite.
TEST_P(BackendOpsTest, Swiglu) {
  const int N = 6, F = 9;
  std::vector<float> hinp = RandomVec(size_t(N) * 2 * F, -4, 4, 51);
  hinp[0] = 90.0f;    // exp(-g) underflows: silu(g) = g
  hinp[1] = -120.0f;  // exp(-g) overflows: silu(g) = -0
  Floats inp(be(), hinp), out(be(), size_t(N) * F);
  be_->SwigluForward(out.data(), inp.data(), N, F);
  std::vector<double> want(size_t(N) * F);
  for (int n = 0; n < N; n++)
    for (int i = 0; i < F; i++) {
      const double g = hinp[n * 2 * F + i], u = hinp[n * 2 * F + F + i];
      want[n * F + i] = g / (1.0 + std::exp(-g)) * u;
    }
  ExpectAllNear(out.vec(), want, Tol(1e-6), "out");
  const std::vector<float> r = RandomVec(size_t(N) * F, -1, 1, 52);
  Floats dout(be(), r), dinp(be(), hinp.size());
  be_->SwigluBackward(dinp.data(), inp.data(), dout.data(), N, F);
  for (float v : dinp.vec()) ASSERT_TRUE(std::isfinite(v));
  // Differences of the double-precision objective (the +-100 inputs make fp32 sums too coarse).
  auto loss = [&] {
    const std::vector<float> x = inp.vec();
    double l = 0;
    for (int n = 0; n < N; n++)
      for (int i = 0; i < F; i++) {
        const double g = x[n * 2 * F + i], u = x[n * 2 * F + F + i];
        l += g / (1.0 + std::exp(-g)) * u * r[n * F + i];
      }
    return l;
  };
  ExpectGradMatchesFiniteDiff("dinp", inp, dinp.vec(), loss, 1e-3f, Tol(2e-3));
  const std::vector<float> once = dinp.vec();
  be_->SwigluBackward(dinp.data(), inp.data(), dout.data(), N, F);
  ExpectDoubled(once, dinp.vec(), Tol(1e-6), "dinp");
}

TEST_P(BackendOpsTest, Gelu) {
  const size_t n = 80;
  const std::vector<float> hinp = RandomVec(n, -4, 4, 19);
  Floats inp(be(), hinp), out(be(), n);
  be_->GeluForward(out.data(), inp.data(), n);
  std::vector<double> want(n);
  for (size_t i = 0; i < n; i++) {
    const double x = hinp[i];
    want[i] = 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
  }
  ExpectAllNear(out.vec(), want, Tol(1e-6), "out");

  const std::vector<float> r = RandomVec(n, -1, 1, 20);
  Floats dout(be(), r), dinp(be(), n);
  be_->GeluBackward(dinp.data(), inp.data(), dout.data(), n);
  auto loss = [&] {
    be_->GeluForward(out.data(), inp.data(), n);
    return Weighted(out, r);
  };
  ExpectGradMatchesFiniteDiff("dinp", inp, dinp.vec(), loss, 1e-3f, Tol(2e-3));
  const std::vector<float> d1 = dinp.vec();
  be_->GeluBackward(dinp.data(), inp.data(), dout.data(), n);
  ExpectDoubled(d1, dinp.vec(), Tol(1e-6), "dinp");
}

// Long arrays (several chunks, all threads) and the saturated tails, against double tanh.
TEST_P(BackendOpsTest, GeluLongAndExtreme) {
  std::vector<float> x = RandomVec(50000, -12, 12, 41);
  const std::vector<float> extremes = {0.0f, -0.0f, 1e-6f, -1e-6f, 30.0f, -30.0f,
                                       1e3f, -1e3f, 1e13f, -1e13f, 1e-30f};
  std::copy(extremes.begin(), extremes.end(), x.begin());
  Floats inp(be(), x), out(be(), x.size()), dinp(be(), x.size());
  Floats dout(be(), std::vector<float>(x.size(), 1.0f));
  be_->GeluForward(out.data(), inp.data(), x.size());
  be_->GeluBackward(dinp.data(), inp.data(), dout.data(), x.size());
  std::vector<double> want(x.size()), want_grad(x.size());
  const double k = std::sqrt(2 / M_PI), c = 0.044715;
  for (size_t i = 0; i < x.size(); i++) {
    const double v = x[i], th = std::tanh(k * (v + c * v * v * v));
    want[i] = 0.5 * v * (1 + th);
    want_grad[i] = 0.5 * (1 + th) + 0.5 * v * (1 - th * th) * k * (1 + 3 * c * v * v);
  }
  ExpectAllNear(out.vec(), want, Tol(1e-6), "gelu");
  ExpectAllNear(dinp.vec(), want_grad, Tol(1e-5), "dgelu");
}

// A NaN activation stays NaN through GELU and SwiGLU (their exp), forward and backward, so the
// non-finite gradient check sees it; its neighbours are untouched. Under UBSan this also runs
// the exp's NaN path, which once converted NaN to an integer.
TEST_P(BackendOpsTest, NanPropagatesThroughGeluAndSwiglu) {
  const int N = 3, F = 40;
  std::vector<float> x = RandomVec(N * 2 * F, -3, 3, 43);
  x[5] = std::numeric_limits<float>::quiet_NaN();
  Floats inp(be(), x), out(be(), N * 2 * F), dinp(be(), N * 2 * F);
  Floats dout(be(), std::vector<float>(N * 2 * F, 1.0f));
  be_->GeluForward(out.data(), inp.data(), x.size());
  be_->GeluBackward(dinp.data(), inp.data(), dout.data(), x.size());
  for (const auto& [name, v] : {std::pair{"gelu", out.vec()}, std::pair{"dgelu", dinp.vec()}}) {
    for (size_t i = 0; i < v.size(); i++) EXPECT_EQ(std::isnan(v[i]), i == 5) << name << " " << i;
  }
  // SwiGLU's row r reads gate x[r][0..F) and up x[r][F..2F): x[5] is row 0's gate 5.
  Floats sout(be(), N * F), sdinp(be(), N * 2 * F);
  be_->SwigluForward(sout.data(), inp.data(), N, F);
  be_->SwigluBackward(sdinp.data(), inp.data(), dout.data(), N, F);
  const std::vector<float> so = sout.vec(), sd = sdinp.vec();
  for (int i = 0; i < N * F; i++) EXPECT_EQ(std::isnan(so[i]), i == 5) << "swiglu " << i;
  EXPECT_TRUE(std::isnan(sd[5]));       // d gate 5 of row 0
  EXPECT_TRUE(std::isnan(sd[F + 5]));   // d up 5 of row 0 (times silu(NaN))
  EXPECT_FALSE(std::isnan(sd[2 * F]));  // row 1 untouched
}

// ---- loss -----------------------------------------------------------------------------------

TEST_P(BackendOpsTest, CrossEntropy) {
  const int N = 4, V = 7, Vp = 8;
  const float dloss = 1.0f / N;
  std::vector<float> logits = RandomVec(N * Vp, -3, 3, 21);
  // Padding columns must get no probability and must not even be read: huge and NaN values.
  for (int i = 0; i < N; i++) logits[i * Vp + V] = i == 1 ? NAN : 1000.0f;
  const std::vector<int32_t> tgt = {0, 6, 3, 3};
  Ints targets(be(), tgt);
  Floats lg(be(), logits), losses(be(), N), logz(be(), N);
  be_->CrossEntropyForwardBackward(losses.data(), logz.data(), lg.data(), targets.data(), N, V, Vp,
                                   dloss);
  const std::vector<float> hlosses = losses.vec(), hlogz = logz.vec(), grad = lg.vec();
  for (int i = 0; i < N; i++) {
    double mx = -INFINITY, sum = 0;
    for (int j = 0; j < V; j++) mx = std::max(mx, double(logits[i * Vp + j]));
    for (int j = 0; j < V; j++) sum += std::exp(logits[i * Vp + j] - mx);
    const double lz = mx + std::log(sum);
    EXPECT_NEAR(hlogz[i], lz, Tol(1e-5));
    EXPECT_NEAR(hlosses[i], -std::log(std::exp(logits[i * Vp + tgt[i]] - lz)), Tol(1e-5));
    double psum = 0;
    for (int j = 0; j < V; j++) {
      const double p = std::exp(logits[i * Vp + j] - lz);
      psum += grad[i * Vp + j] / dloss + (j == tgt[i]);
      EXPECT_NEAR(grad[i * Vp + j], (p - (j == tgt[i])) * dloss, Tol(1e-6));
    }
    EXPECT_NEAR(psum, 1.0, Tol(1e-5));
    for (int j = V; j < Vp; j++) EXPECT_EQ(grad[i * Vp + j], 0.0f);  // padding: zero gradient
  }

  // Gradient against finite differences of dloss * sum_i loss_i; logz is optional. The op
  // overwrites its logits, so each evaluation works on a copy of x.
  Floats x(be(), logits), work(be(), N * Vp);
  auto loss = [&] {
    be_->Copy(work.data(), x.data(), work.size());
    be_->CrossEntropyForwardBackward(losses.data(), nullptr, work.data(), targets.data(), N, V, Vp,
                                     dloss);
    const std::vector<float> l = losses.vec();
    double s = 0;
    for (int i = 0; i < N; i++) s += double(l[i]) * dloss;
    return s;
  };
  std::vector<size_t> real;
  for (int i = 0; i < N; i++) {
    for (int j = 0; j < V; j++) real.push_back(i * Vp + j);
  }
  ExpectGradMatchesFiniteDiff("dlogits", x, grad, loss, 1e-2f, Tol(2e-3), real);

  // A target outside the vocabulary is an error, not a silent out-of-bounds read.
  Ints bad(be(), std::vector<int32_t>{0, V, 1, 2});
  work.Set(logits);
  EXPECT_THROW(be_->CrossEntropyForwardBackward(losses.data(), nullptr, work.data(), bad.data(), N,
                                                V, Vp, dloss),
               KeelError);
}

// A realistic vocabulary row (vectorised path) against double-precision log-softmax.
TEST_P(BackendOpsTest, CrossEntropyLargeVocab) {
  const int N = 3, V = 1003, Vp = 1024;
  const float dloss = 0.5f;
  const std::vector<float> logits = RandomVec(N * Vp, -20, 20, 42);
  const std::vector<int32_t> tgt = {0, 500, V - 1};
  Ints targets(be(), tgt);
  Floats lg(be(), logits), losses(be(), N), logz(be(), N);
  be_->CrossEntropyForwardBackward(losses.data(), logz.data(), lg.data(), targets.data(), N, V, Vp,
                                   dloss);
  const std::vector<float> hlosses = losses.vec(), hlogz = logz.vec(), grad = lg.vec();
  for (int i = 0; i < N; i++) {
    double mx = -INFINITY, sum = 0;
    for (int j = 0; j < V; j++) mx = std::max(mx, double(logits[i * Vp + j]));
    for (int j = 0; j < V; j++) sum += std::exp(logits[i * Vp + j] - mx);
    const double lz = mx + std::log(sum);
    EXPECT_NEAR(hlogz[i], lz, Tol(1e-5) * std::abs(lz));
    EXPECT_NEAR(hlosses[i], lz - logits[i * Vp + tgt[i]], Tol(1e-5) * std::max(1.0, std::abs(lz)));
    for (int j = 0; j < V; j++) {
      const double p = std::exp(logits[i * Vp + j] - lz);
      ASSERT_NEAR(grad[i * Vp + j], (p - (j == tgt[i])) * dloss, Tol(1e-6)) << i << "," << j;
    }
    for (int j = V; j < Vp; j++) EXPECT_EQ(grad[i * Vp + j], 0.0f);
  }
}

TEST_P(BackendOpsTest, Softmax) {
  const int V = 9;
  const float temp = 0.7f;
  const std::vector<float> hlogits = RandomVec(V, -3, 3, 22);
  Floats logits(be(), hlogits), probs(be(), V);
  be_->Softmax(probs.data(), logits.data(), V, temp);
  const std::vector<float> hprobs = probs.vec();
  double mx = -INFINITY, sum = 0;
  for (int j = 0; j < V; j++) mx = std::max(mx, double(hlogits[j]) / temp);
  for (int j = 0; j < V; j++) sum += std::exp(hlogits[j] / double(temp) - mx);
  for (int j = 0; j < V; j++) {
    EXPECT_NEAR(hprobs[j], std::exp(hlogits[j] / double(temp) - mx) / sum, Tol(1e-6));
  }
}

// ---- reductions and the optimizer -----------------------------------------------------------

TEST_P(BackendOpsTest, Reductions) {
  // Several 1<<16 chunks plus a partial one; integer squares are exact in double.
  const size_t n = 200003;
  std::vector<float> x(n);
  double want = 0;
  size_t zeros = 0;
  for (size_t i = 0; i < n; i++) {
    x[i] = float(int(i % 7) - 3);
    want += x[i] * x[i];
    zeros += x[i] == 0.0f;
  }
  Floats dx(be(), x);
  EXPECT_EQ(be_->SumSquaresAndZeros(dx.data(), n).sum_sq, want);
  Backend::SquaresAndZeros sz = be_->SumSquaresAndZeros(dx.data(), n);
  EXPECT_EQ(sz.sum_sq, want);
  EXPECT_EQ(sz.zeros, zeros);
  EXPECT_EQ(be_->CountNonFinite(dx.data(), n), 0u);
  x[5] = std::numeric_limits<float>::quiet_NaN();
  x[70000] = std::numeric_limits<float>::infinity();
  x[n - 1] = -std::numeric_limits<float>::infinity();
  x[6] = std::numeric_limits<float>::max();         // finite
  x[7] = std::numeric_limits<float>::denorm_min();  // finite, not zero
  x[8] = -0.0f;                                     // a zero
  dx.Set(x);
  EXPECT_EQ(be_->CountNonFinite(dx.data(), n), 3u);
  size_t zeros2 = 0;
  for (size_t i = 0; i < n; i++) zeros2 += x[i] == 0.0f;
  sz = be_->SumSquaresAndZeros(dx.data(), n);
  EXPECT_EQ(sz.zeros, zeros2);
  EXPECT_TRUE(std::isnan(sz.sum_sq));
  EXPECT_EQ(be_->SumSquaresAndZeros(dx.data(), 0).sum_sq, 0.0);
  sz = be_->SumSquaresAndZeros(dx.data(), 0);
  EXPECT_EQ(sz.sum_sq, 0.0);
  EXPECT_EQ(sz.zeros, 0u);
}

TEST_P(BackendOpsTest, AdamW) {
  const size_t n = 100;
  const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  const std::vector<float> p0 = RandomVec(n, -1, 1, 23), g0 = RandomVec(n, -1, 1, 24),
                           m0 = RandomVec(n, -0.1f, 0.1f, 25), v0 = RandomVec(n, 0, 0.01f, 26);
  Floats p(be(), p0), g(be(), g0), m(be(), m0), v(be(), v0);
  std::vector<double> rp(p0.begin(), p0.end()), rm(m0.begin(), m0.end()), rv(v0.begin(), v0.end());
  for (int64_t step = 1; step <= 3; step++) {
    be_->AdamWUpdate(p.data(), g.data(), m.data(), v.data(), n, lr, b1, b2, eps, wd, step);
    for (size_t i = 0; i < n; i++) {
      const double gi = g0[i];
      rm[i] = double(b1) * rm[i] + (1 - double(b1)) * gi;
      rv[i] = double(b2) * rv[i] + (1 - double(b2)) * gi * gi;
      const double mhat = rm[i] / (1 - std::pow(double(b1), step));
      const double vhat = rv[i] / (1 - std::pow(double(b2), step));
      rp[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * rp[i]);
    }
    ExpectAllNear(p.vec(), rp, Tol(1e-5), "param");
    ExpectAllNear(m.vec(), rm, Tol(1e-5), "m");
    ExpectAllNear(v.vec(), rv, Tol(1e-5), "v");
  }
}

// bf16/fp16: the update can also write the new weights' 16-bit compute copy, bit for bit what
// ToLowPrecision makes of them, with or without the guard's statistics; the update is unchanged.
TEST_P(BackendOpsTest, AdamWWritesTheWeightsLowPrecisionCopy) {
  if (be_->precision() == Precision::kFp32) GTEST_SKIP() << "no 16-bit copy in fp32";
  const size_t n = 70000;  // several chunks
  const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  const std::vector<float> p0 = RandomVec(n, -1, 1, 23), g0 = RandomVec(n, -1, 1, 24),
                           m0 = RandomVec(n, -0.1f, 0.1f, 25), v0 = RandomVec(n, 0, 0.01f, 26);
  for (bool with_stats : {false, true}) {
    SCOPED_TRACE(with_stats ? "with stats" : "without stats");
    Floats p(be(), p0), g(be(), g0), m(be(), m0), v(be(), v0), p2(be(), p0), m2(be(), m0),
        v2(be(), v0);
    uint16_t* copy = be_->AllocHalves(n);
    uint16_t* want = be_->AllocHalves(n);
    Backend::AdamWStats st;
    be_->AdamWUpdate(p.data(), g.data(), m.data(), v.data(), n, lr, b1, b2, eps, wd, 3,
                     with_stats ? &st : nullptr, 0.5f, copy);
    be_->AdamWUpdate(p2.data(), g.data(), m2.data(), v2.data(), n, lr, b1, b2, eps, wd, 3, nullptr,
                     0.5f);
    EXPECT_TRUE(SameBits(p.vec(), p2.vec()));
    EXPECT_TRUE(SameBits(m.vec(), m2.vec()));
    be_->ToLowPrecision(want, p.data(), n);
    // The backends under test keep 16-bit storage in host memory.
    EXPECT_EQ(std::vector<uint16_t>(copy, copy + n), std::vector<uint16_t>(want, want + n));
    be_->Free(copy);
    be_->Free(want);
  }
}

// The guard's signals measured inside the update: same update bits as without them, and the
// sums and max equal direct computations; 1 and 2 threads give the same sums.
TEST_P(BackendOpsTest, AdamWStatsMeasureTheUpdateWithoutChangingIt) {
  const size_t n = 70000;  // several reduction chunks
  const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  std::unique_ptr<Backend> one = GetParam().make(1);
  const std::vector<float> p0 = RandomVec(n, -1, 1, 23), g0 = RandomVec(n, -1, 1, 24),
                           m0 = RandomVec(n, -0.1f, 0.1f, 25), v0 = RandomVec(n, 0, 0.01f, 26);
  std::vector<double> update_sq, param_sq;
  for (Backend* k : {be(), one.get()}) {
    Floats p(k, p0), g(k, g0), m(k, m0), v(k, v0);
    Floats p2(k, p0), m2(k, m0), v2(k, v0);
    Backend::AdamWStats st;
    st.max_v = 0;
    k->AdamWUpdate(p.data(), g.data(), m.data(), v.data(), n, lr, b1, b2, eps, wd, 2, &st);
    k->AdamWUpdate(p2.data(), g.data(), m2.data(), v2.data(), n, lr, b1, b2, eps, wd, 2);
    const std::vector<float> hp = p.vec(), hv = v.vec();
    EXPECT_EQ(hp, p2.vec());
    EXPECT_EQ(hv, v2.vec());
    double du = 0, dp = 0;
    float vmax = 0;
    for (size_t i = 0; i < n; i++) {
      du += (double(hp[i]) - p0[i]) * (double(hp[i]) - p0[i]);
      dp += double(hp[i]) * hp[i];
      vmax = std::max(vmax, hv[i]);
    }
    // Float differences and sums within a chunk.
    EXPECT_NEAR(st.update_sq, du, Tol(1e-4) * du);
    EXPECT_NEAR(st.param_sq, dp, Tol(1e-4) * dp);
    EXPECT_EQ(st.max_v, vmax);
    update_sq.push_back(st.update_sq);
    param_sq.push_back(st.param_sq);
  }
  EXPECT_EQ(update_sq[0], update_sq[1]);
  EXPECT_EQ(param_sq[0], param_sq[1]);
}

// ---- determinism ----------------------------------------------------------------------------

// Each op run twice on the same inputs gives the same bits; thread-count-independent reductions
// also match between 1 and 2 threads (two backends, each with its own copy of the inputs).
TEST_P(BackendOpsTest, Deterministic) {
  std::unique_ptr<Backend> one = GetParam().make(1);
  const int B = 2, T = 96, C = 128, NH = 4, N = B * T, V = 100, Vp = 128;
  std::vector<int32_t> tok(N);
  for (int i = 0; i < N; i++) tok[i] = (i * 37) % V;
  const std::vector<float> hx = RandomVec(N * C, -1, 1, 30), hdy = RandomVec(N * C, -1, 1, 31),
                           hw = RandomVec(C, 0.5, 1.5, 32), hb = RandomVec(C, -1, 1, 33),
                           hwm = RandomVec(3 * C * C, -0.1f, 0.1f, 34),
                           hbm = RandomVec(3 * C, -1, 1, 35),
                           hdy3 = RandomVec(N * 3 * C, -1, 1, 36),
                           hwte = RandomVec(V * C, -1, 1, 37), hwpe = RandomVec(T * C, -1, 1, 38),
                           hlogits = RandomVec(N * Vp, -4, 4, 39);
  const std::vector<float> slopes = {0.5f, 0.25f, 0.125f, 0.0625f};

  // Runs everything on backend `k`, returns all outputs concatenated.
  auto run = [&](Backend* k) {
    Ints tokens(k, tok);
    Floats x(k, hx), dy(k, hdy), w(k, hw), b(k, hb), wm(k, hwm), bm(k, hbm), dy3(k, hdy3),
        wte(k, hwte), wpe(k, hwpe), sl(k, slopes);
    std::vector<float> all;
    auto take = [&](const Floats& f) {
      const std::vector<float> h = f.vec();
      all.insert(all.end(), h.begin(), h.end());
    };
    Floats emb(k, N * C), dwte(k, V * C), dwpe(k, T * C);
    k->EmbeddingForward(emb.data(), tokens.data(), wte.data(), wpe.data(), B, T, C, V);
    k->EmbeddingBackward(dwte.data(), dwpe.data(), dy.data(), tokens.data(), B, T, C, V);
    Floats ln(k, N * C), mean(k, N), rstd(k, N), dx(k, N * C), dw(k, C), db(k, C);
    k->LayerNormForward(ln.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                        1e-5f);
    k->LayerNormBackward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(),
                         mean.data(), rstd.data(), N, C);
    Floats qkv(k, N * 3 * C), dln(k, N * C), dwm(k, 3 * C * C), dbm(k, 3 * C);
    k->MatmulForward(qkv.data(), ln.data(), wm.data(), bm.data(), N, C, 3 * C);
    k->MatmulBackward(dln.data(), dwm.data(), dbm.data(), dy3.data(), ln.data(), wm.data(), N, C,
                      3 * C);
    Floats att(k, size_t(B) * NH * T * T), ao(k, N * C), dqkv(k, N * 3 * C);
    k->AttentionForward(ao.data(), att.data(), qkv.data(), sl.data(), B, T, C, NH);
    k->AttentionBackward(dqkv.data(), dy.data(), qkv.data(), att.data(), B, T, C, NH);
    Floats gl(k, N * C), dg(k, N * C);
    k->GeluForward(gl.data(), x.data(), N * C);
    k->GeluBackward(dg.data(), x.data(), dy.data(), N * C);
    Floats lg(k, hlogits), losses(k, N), lz(k, N);
    k->CrossEntropyForwardBackward(losses.data(), lz.data(), lg.data(), tokens.data(), N, V, Vp,
                                   1.0f / N);
    for (const Floats* f : {&emb, &dwte, &dwpe, &ln, &mean, &rstd, &dx, &dw, &db,     &qkv, &dln,
                            &dwm, &dbm,  &att,  &ao, &dqkv, &gl,   &dg, &lg, &losses, &lz}) {
      take(*f);
    }
    return all;
  };
  const std::vector<float> r1 = run(be()), r2 = run(be());
  ASSERT_EQ(r1.size(), r2.size());
  EXPECT_TRUE(SameBits(r1, r2));

  // Reductions designed to be independent of the thread count.
  const std::vector<float> hbig = RandomVec(300000, -3, 3, 40);
  Floats big2(be(), hbig), big1(one.get(), hbig);
  const double s2 = be_->SumSquaresAndZeros(big2.data(), big2.size()).sum_sq;
  const double s1 = one->SumSquaresAndZeros(big1.data(), big1.size()).sum_sq;
  EXPECT_EQ(std::memcmp(&s1, &s2, sizeof(double)), 0);
  EXPECT_EQ(be_->SumSquaresAndZeros(big2.data(), big2.size()).sum_sq, s2);
  {
    auto grads = [&](Backend* k) {
      Ints tokens(k, tok);
      Floats dy(k, hdy), a(k, V * C), p(k, T * C);
      k->EmbeddingBackward(a.data(), p.data(), dy.data(), tokens.data(), B, T, C, V);
      return std::make_pair(a.vec(), p.vec());
    };
    const auto g2 = grads(be()), g1 = grads(one.get());
    EXPECT_TRUE(SameBits(g1.first, g2.first));
    EXPECT_TRUE(SameBits(g1.second, g2.second));
  }
  {
    // Both backwards see the same statistics: the 2-thread forward's.
    std::vector<float> hmean, hrstd;
    {
      Floats x(be(), hx), w(be(), hw), b(be(), hb), mean(be(), N), rstd(be(), N), ln(be(), N * C);
      be_->LayerNormForward(ln.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                            1e-5f);
      hmean = mean.vec();
      hrstd = rstd.vec();
    }
    auto grads = [&](Backend* k) {
      Floats x(k, hx), w(k, hw), dy(k, hdy), mean(k, hmean), rstd(k, hrstd), dw(k, C), db(k, C);
      k->LayerNormBackward(nullptr, dw.data(), db.data(), dy.data(), x.data(), w.data(),
                           mean.data(), rstd.data(), N, C);
      return std::make_pair(dw.vec(), db.vec());
    };
    const auto g2 = grads(be()), g1 = grads(one.get());
    EXPECT_TRUE(SameBits(g1.first, g2.first));
    EXPECT_TRUE(SameBits(g1.second, g2.second));
  }
  {
    // RMSNorm's weight gradient, and grouped-query attention's key/value gradients (each the sum
    // over the query heads of its group), do not depend on the thread count either.
    auto grads = [&](Backend* k) {
      const int G = 2, W = (NH + 2 * G) * (C / NH);
      const std::vector<float> hq = RandomVec(size_t(N) * W, -1, 1, 41);
      Floats x(k, hx), w(k, hw), dy(k, hdy), rstd(k, N), ln(k, N * C), dw(k, C);
      k->RmsNormForward(ln.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
      k->RmsNormBackward(nullptr, dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C);
      Floats qkv(k, hq), att(k, size_t(B) * NH * T * T), ao(k, N * C), dqkv(k, size_t(N) * W);
      k->AttentionForward(ao.data(), att.data(), qkv.data(), nullptr, B, T, C, NH, nullptr, nullptr,
                          G);
      k->AttentionBackward(dqkv.data(), dy.data(), qkv.data(), att.data(), B, T, C, NH, G);
      return std::make_pair(dw.vec(), dqkv.vec());
    };
    const auto g2 = grads(be()), g1 = grads(one.get());
    EXPECT_TRUE(SameBits(g1.first, g2.first));
    EXPECT_TRUE(SameBits(g1.second, g2.second));
  }
  {
    auto dbias = [&](Backend* k) {
      Floats x(k, hx), wm(k, hwm), dy3(k, hdy3), d(k, 3 * C), dw(k, 3 * C * C);
      k->MatmulBackward(nullptr, dw.data(), d.data(), dy3.data(), x.data(), wm.data(), N, C, 3 * C);
      return d.vec();
    };
    EXPECT_TRUE(SameBits(dbias(one.get()), dbias(be())));
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendOpsTest, ::testing::ValuesIn(TestBackends()),
                         [](const ::testing::TestParamInfo<TestBackend>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace keel

// CPU backend tests: every backward against central finite differences of its forward, forwards
// against naive double-precision loops, accumulation (+=) semantics, and bit-determinism.
#include "backend/cpu/cpu_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <type_traits>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"

namespace keel {
namespace {

// A backend buffer (host memory on the CPU backend) that frees itself.
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
  Buf(Backend* be, const std::vector<T>& v) : Buf(be, v.size()) {
    std::copy(v.begin(), v.end(), p_);
  }
  ~Buf() { be_->Free(p_); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;

  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }
  T& operator[](size_t i) { return p_[i]; }
  std::vector<T> vec() const { return std::vector<T>(p_, p_ + n_); }
  void Set(const std::vector<T>& v) { std::copy(v.begin(), v.end(), p_); }

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
double Weighted(const float* out, const std::vector<float>& r) {
  double s = 0.0;
  for (size_t i = 0; i < r.size(); i++) s += double(out[i]) * r[i];
  return s;
}

// For each index i, compares grad[i] with the central difference (L(x+eps) - L(x-eps)) / 2eps,
// where loss() evaluates L with the current contents of x. All elements when indices is empty.
void ExpectGradMatchesFiniteDiff(const char* what, float* x, size_t n,
                                 const std::vector<float>& grad,
                                 const std::function<double()>& loss, float eps = 1e-2f,
                                 double tol = 2e-3, std::vector<size_t> indices = {}) {
  if (indices.empty()) {
    for (size_t i = 0; i < n; i++) indices.push_back(i);
  }
  for (size_t i : indices) {
    const float orig = x[i];
    const float up = orig + eps, down = orig - eps;
    x[i] = up;
    const double lp = loss();
    x[i] = down;
    const double lm = loss();
    x[i] = orig;
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
void ExpectDoubled(const std::vector<float>& once, const std::vector<float>& twice,
                   const char* what) {
  ASSERT_EQ(once.size(), twice.size());
  for (size_t i = 0; i < once.size(); i++) {
    EXPECT_NEAR(twice[i], 2.0f * once[i], 1e-6f * std::max(1.0f, std::abs(2.0f * once[i])))
        << what << "[" << i << "]";
  }
}

bool SameBits(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

class CpuBackendTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be_ = MakeCpuBackend(2);
  Backend* be() { return be_.get(); }
};

TEST_F(CpuBackendTest, DescribeNamesBlasAndThreads) {
  EXPECT_EQ(be_->Name(), "cpu");
  const std::string d = be_->Describe();
  EXPECT_NE(d.find("OpenBLAS"), std::string::npos) << d;
  EXPECT_NE(d.find("2 threads"), std::string::npos) << d;
  EXPECT_NE(d.find("kernels"), std::string::npos) << d;
}

TEST_F(CpuBackendTest, AllocIsZeroedAndAligned) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{17}, size_t{1000}}) {
    float* f = be_->AllocFloats(n);
    int32_t* k = be_->AllocInts(n);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(f) % 64, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(k) % 64, 0u);
    for (size_t i = 0; i < n; i++) {
      EXPECT_EQ(f[i], 0.0f);
      EXPECT_EQ(k[i], 0);
    }
    be_->Free(f);
    be_->Free(k);
  }
}

TEST_F(CpuBackendTest, CopiesAndPointwise) {
  const size_t n = 1000;
  std::vector<float> a = RandomVec(n, -1, 1, 1), b = RandomVec(n, -1, 1, 2);
  Floats da(be(), n), db(be(), n), out(be(), n);
  be_->CopyToDevice(da.data(), a.data(), n);
  be_->CopyToDevice(db.data(), b.data(), n);
  be_->Add(out.data(), da.data(), db.data(), n);
  for (size_t i = 0; i < n; i++) EXPECT_EQ(out[i], a[i] + b[i]);
  be_->Add(da.data(), da.data(), db.data(), n);  // out aliases a
  for (size_t i = 0; i < n; i++) EXPECT_EQ(da[i], a[i] + b[i]);
  be_->Accumulate(out.data(), db.data(), n);
  for (size_t i = 0; i < n; i++) EXPECT_EQ(out[i], (a[i] + b[i]) + b[i]);
  be_->Scale(db.data(), n, 0.5f);
  for (size_t i = 0; i < n; i++) EXPECT_EQ(db[i], b[i] * 0.5f);
  be_->Copy(out.data(), db.data(), n);
  std::vector<float> host(n);
  be_->CopyToHost(host.data(), out.data(), n);
  for (size_t i = 0; i < n; i++) EXPECT_EQ(host[i], b[i] * 0.5f);
  be_->Zero(out.data(), n);
  for (size_t i = 0; i < n; i++) EXPECT_EQ(out[i], 0.0f);
  std::vector<int32_t> ints = {3, -1, 7};
  Ints di(be(), 3);
  be_->CopyIntsToDevice(di.data(), ints.data(), 3);
  EXPECT_EQ(di.vec(), ints);
}

// ---- embeddings -----------------------------------------------------------------------------

TEST_F(CpuBackendTest, Embedding) {
  const int B = 2, T = 5, C = 8, V = 7;
  const std::vector<int32_t> tok = {1, 3, 3, 0, 6, 3, 1, 2, 3, 5};  // repeats accumulate
  Ints tokens(be(), tok);
  for (bool with_wpe : {true, false}) {
    SCOPED_TRACE(with_wpe ? "with wpe" : "without wpe");
    Floats wte(be(), RandomVec(V * C, -1, 1, 3)), wpe(be(), RandomVec(T * C, -1, 1, 4));
    float* wpe_p = with_wpe ? wpe.data() : nullptr;
    Floats out(be(), B * T * C);
    be_->EmbeddingForward(out.data(), tokens.data(), wte.data(), wpe_p, B, T, C);
    for (int bt = 0; bt < B * T; bt++) {
      for (int c = 0; c < C; c++) {
        const float want = wte[tok[bt] * C + c] + (with_wpe ? wpe[(bt % T) * C + c] : 0.0f);
        EXPECT_EQ(out[bt * C + c], want);
      }
    }
    const std::vector<float> r = RandomVec(B * T * C, -1, 1, 5);
    Floats dout(be(), r), dwte(be(), V * C), dwpe(be(), T * C);
    be_->EmbeddingBackward(dwte.data(), with_wpe ? dwpe.data() : nullptr, dout.data(),
                           tokens.data(), B, T, C);
    auto loss = [&] {
      be_->EmbeddingForward(out.data(), tokens.data(), wte.data(), wpe_p, B, T, C);
      return Weighted(out.data(), r);
    };
    ExpectGradMatchesFiniteDiff("dwte", wte.data(), wte.size(), dwte.vec(), loss);
    if (with_wpe) {
      ExpectGradMatchesFiniteDiff("dwpe", wpe.data(), wpe.size(), dwpe.vec(), loss);
    } else {
      EXPECT_EQ(dwpe.vec(), std::vector<float>(T * C, 0.0f));  // untouched when dwpe is null
    }
    // Accumulation: a second backward doubles the gradients.
    const std::vector<float> dwte1 = dwte.vec(), dwpe1 = dwpe.vec();
    be_->EmbeddingBackward(dwte.data(), with_wpe ? dwpe.data() : nullptr, dout.data(),
                           tokens.data(), B, T, C);
    ExpectDoubled(dwte1, dwte.vec(), "dwte");
    if (with_wpe) ExpectDoubled(dwpe1, dwpe.vec(), "dwpe");
  }
}

// ---- layer norm -----------------------------------------------------------------------------

TEST_F(CpuBackendTest, LayerNorm) {
  const int N = 10, C = 8;
  const float eps = 1e-5f;
  Floats inp(be(), RandomVec(N * C, -2, 3, 6)), w(be(), RandomVec(C, 0.5, 1.5, 7)),
      b(be(), RandomVec(C, -0.5, 0.5, 8));
  Floats out(be(), N * C), mean(be(), N), rstd(be(), N);
  be_->LayerNormForward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C,
                        eps);
  // Forward against a double reference.
  std::vector<double> want(N * C), want_mean(N), want_rstd(N);
  for (int n = 0; n < N; n++) {
    double m = 0, var = 0;
    for (int c = 0; c < C; c++) m += inp[n * C + c];
    m /= C;
    for (int c = 0; c < C; c++) var += (inp[n * C + c] - m) * (inp[n * C + c] - m);
    var /= C;
    const double s = 1.0 / std::sqrt(var + eps);
    for (int c = 0; c < C; c++) want[n * C + c] = (inp[n * C + c] - m) * s * w[c] + b[c];
    want_mean[n] = m;
    want_rstd[n] = s;
  }
  ExpectAllNear(out.vec(), want, 1e-5, "out");
  ExpectAllNear(mean.vec(), want_mean, 1e-5, "mean");
  ExpectAllNear(rstd.vec(), want_rstd, 1e-5, "rstd");

  const std::vector<float> r = RandomVec(N * C, -1, 1, 9);
  Floats dout(be(), r), dinp(be(), N * C), dw(be(), C), db(be(), C);
  be_->LayerNormBackward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(),
                         mean.data(), rstd.data(), N, C);
  Floats out2(be(), N * C), mean2(be(), N), rstd2(be(), N);
  auto loss = [&] {
    be_->LayerNormForward(out2.data(), mean2.data(), rstd2.data(), inp.data(), w.data(), b.data(),
                          N, C, eps);
    return Weighted(out2.data(), r);
  };
  ExpectGradMatchesFiniteDiff("dinp", inp.data(), inp.size(), dinp.vec(), loss, 1e-3f);
  ExpectGradMatchesFiniteDiff("dweight", w.data(), w.size(), dw.vec(), loss, 1e-3f);
  ExpectGradMatchesFiniteDiff("dbias", b.data(), b.size(), db.vec(), loss, 1e-3f);

  const std::vector<float> dinp1 = dinp.vec(), dw1 = dw.vec(), db1 = db.vec();
  be_->LayerNormBackward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(),
                         mean.data(), rstd.data(), N, C);
  ExpectDoubled(dinp1, dinp.vec(), "dinp");
  ExpectDoubled(dw1, dw.vec(), "dweight");
  ExpectDoubled(db1, db.vec(), "dbias");
}

// ---- linear layer ---------------------------------------------------------------------------

TEST_F(CpuBackendTest, Matmul) {
  const int N = 10, IC = 8, OC = 6;
  for (bool with_bias : {true, false}) {
    SCOPED_TRACE(with_bias ? "with bias" : "without bias");
    Floats inp(be(), RandomVec(N * IC, -1, 1, 10)), w(be(), RandomVec(OC * IC, -1, 1, 11)),
        bias(be(), RandomVec(OC, -1, 1, 12));
    float* bias_p = with_bias ? bias.data() : nullptr;
    Floats out(be(), N * OC);
    be_->MatmulForward(out.data(), inp.data(), w.data(), bias_p, N, IC, OC);
    std::vector<double> want(N * OC);
    for (int n = 0; n < N; n++) {
      for (int o = 0; o < OC; o++) {
        double s = with_bias ? bias[o] : 0.0;
        for (int i = 0; i < IC; i++) s += double(inp[n * IC + i]) * w[o * IC + i];
        want[n * OC + o] = s;
      }
    }
    ExpectAllNear(out.vec(), want, 1e-5, "out");

    const std::vector<float> r = RandomVec(N * OC, -1, 1, 13);
    Floats dout(be(), r), dinp(be(), N * IC), dw(be(), OC * IC), db(be(), OC);
    be_->MatmulBackward(dinp.data(), dw.data(), with_bias ? db.data() : nullptr, dout.data(),
                        inp.data(), w.data(), N, IC, OC);
    auto loss = [&] {
      be_->MatmulForward(out.data(), inp.data(), w.data(), bias_p, N, IC, OC);
      return Weighted(out.data(), r);
    };
    ExpectGradMatchesFiniteDiff("dinp", inp.data(), inp.size(), dinp.vec(), loss);
    ExpectGradMatchesFiniteDiff("dweight", w.data(), w.size(), dw.vec(), loss);
    if (with_bias) ExpectGradMatchesFiniteDiff("dbias", bias.data(), bias.size(), db.vec(), loss);

    const std::vector<float> dinp1 = dinp.vec(), dw1 = dw.vec(), db1 = db.vec();
    be_->MatmulBackward(dinp.data(), dw.data(), with_bias ? db.data() : nullptr, dout.data(),
                        inp.data(), w.data(), N, IC, OC);
    ExpectDoubled(dinp1, dinp.vec(), "dinp");
    ExpectDoubled(dw1, dw.vec(), "dweight");
    if (with_bias) ExpectDoubled(db1, db.vec(), "dbias");
  }
  // dinp may be null (the first layer needs no input gradient).
  Floats inp(be(), RandomVec(N * IC, -1, 1, 14)), w(be(), RandomVec(OC * IC, -1, 1, 15));
  Floats dout(be(), RandomVec(N * OC, -1, 1, 16)), dw(be(), OC * IC), dw_ref(be(), OC * IC),
      dinp(be(), N * IC);
  be_->MatmulBackward(nullptr, dw.data(), nullptr, dout.data(), inp.data(), w.data(), N, IC, OC);
  be_->MatmulBackward(dinp.data(), dw_ref.data(), nullptr, dout.data(), inp.data(), w.data(), N, IC,
                      OC);
  EXPECT_TRUE(SameBits(dw.data(), dw_ref.data(), dw.size()));
}

// ---- causal self-attention ------------------------------------------------------------------

// Double-precision reference: q and k scaled by hs^-1/4, ALiBi bias, causal softmax, P v.
// Also returns the probabilities in att (B,NH,T,T) when att is not null.
std::vector<double> ReferenceAttention(const std::vector<float>& qkv, const float* slopes, int B,
                                       int T, int C, int NH, std::vector<double>* att) {
  const int hs = C / NH;
  const double a = std::pow(double(hs), -0.25);
  std::vector<double> out(size_t(B) * T * C, 0.0);
  if (att != nullptr) att->assign(size_t(B) * NH * T * T, 0.0);
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      for (int i = 0; i < T; i++) {
        const float* q = &qkv[(size_t(b) * T + i) * 3 * C + h * hs];
        std::vector<double> s(i + 1);
        double mx = -INFINITY;
        for (int j = 0; j <= i; j++) {
          const float* k = &qkv[(size_t(b) * T + j) * 3 * C + C + h * hs];
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
          const float* v = &qkv[(size_t(b) * T + j) * 3 * C + 2 * C + h * hs];
          for (int d = 0; d < hs; d++) out[(size_t(b) * T + i) * C + h * hs + d] += p * v[d];
        }
      }
    }
  }
  return out;
}

void CheckAttention(Backend* be, int B, int T, int C, int NH, const float* slopes, bool all_grads) {
  Floats qkv(be, RandomVec(size_t(B) * T * 3 * C, -2, 2, 17 + T));
  Floats out(be, size_t(B) * T * C), att(be, size_t(B) * NH * T * T), mx(be, size_t(B) * NH);
  be->AttentionForward(out.data(), att.data(), qkv.data(), slopes, B, T, C, NH, mx.data());

  // The max pre-softmax score per (b, h), brute force in double.
  const int hs = C / NH;
  const double a = std::pow(double(hs), -0.25);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      double want_max = -1e300;
      for (int i = 0; i < T; i++)
        for (int j = 0; j <= i; j++) {
          double d = 0;
          for (int k = 0; k < hs; k++)
            d += a * qkv[(size_t(b) * T + i) * 3 * C + h * hs + k] * a *
                 qkv[(size_t(b) * T + j) * 3 * C + C + h * hs + k];
          if (slopes != nullptr) d -= slopes[h] * (i - j);
          want_max = std::max(want_max, d);
        }
      EXPECT_NEAR(mx[size_t(b) * NH + h], want_max, 1e-4 * (1 + std::fabs(want_max)))
          << "max logit of sequence " << b << " head " << h;
    }

  std::vector<double> want_att;
  const std::vector<double> want = ReferenceAttention(qkv.vec(), slopes, B, T, C, NH, &want_att);
  ExpectAllNear(out.vec(), want, 2e-5, "out");
  ExpectAllNear(att.vec(), want_att, 2e-5, "att");  // includes exact zeros above the diagonal
  for (size_t bhi = 0; bhi < size_t(B) * NH * T; bhi++) {
    const int i = bhi % T;
    for (int j = i + 1; j < T; j++) ASSERT_EQ(att[bhi * T + j], 0.0f);
  }

  // Causality: changing token j (its q, k and v) leaves output rows i < j bit-identical.
  {
    Floats out2(be, out.size()), att2(be, att.size());
    for (int j : {1, T / 2, T - 1}) {
      const std::vector<float> saved = qkv.vec();
      for (int b = 0; b < B; b++) {
        for (int c = 0; c < 3 * C; c++) qkv[(size_t(b) * T + j) * 3 * C + c] += 0.75f;
      }
      be->AttentionForward(out2.data(), att2.data(), qkv.data(), slopes, B, T, C, NH);
      qkv.Set(saved);
      for (int b = 0; b < B; b++) {
        EXPECT_TRUE(SameBits(out.data() + size_t(b) * T * C, out2.data() + size_t(b) * T * C,
                             size_t(j) * C))
            << "rows before token " << j << " changed";
      }
      bool changed = false;
      for (int c = 0; c < C; c++) changed |= out[size_t(j) * C + c] != out2[size_t(j) * C + c];
      EXPECT_TRUE(changed) << "row " << j << " does not depend on its own token";
    }
  }

  // Gradient against finite differences of sum(out * r).
  const std::vector<float> r = RandomVec(out.size(), -1, 1, 18);
  Floats dout(be, r), dqkv(be, qkv.size());
  be->AttentionBackward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
  Floats out2(be, out.size()), att2(be, att.size());
  auto loss = [&] {
    be->AttentionForward(out2.data(), att2.data(), qkv.data(), slopes, B, T, C, NH);
    return Weighted(out2.data(), r);
  };
  // Long sequences: a subset of elements, differentiating the double reference (many small
  // multi-threaded calls are slow on a shared machine, and the reference is exact enough).
  auto reference_loss = [&] {
    const std::vector<double> o = ReferenceAttention(qkv.vec(), slopes, B, T, C, NH, nullptr);
    double s = 0;
    for (size_t i = 0; i < o.size(); i++) s += o[i] * r[i];
    return s;
  };
  std::vector<size_t> idx;
  if (!all_grads) {
    for (size_t i = 0; i < qkv.size(); i += 53) idx.push_back(i);
  }
  ExpectGradMatchesFiniteDiff("dqkv", qkv.data(), qkv.size(), dqkv.vec(),
                              all_grads ? std::function<double()>(loss) : reference_loss, 1e-2f,
                              2e-3, idx);

  const std::vector<float> d1 = dqkv.vec();
  be->AttentionBackward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
  ExpectDoubled(d1, dqkv.vec(), "dqkv");
}

TEST_F(CpuBackendTest, Attention) {
  CheckAttention(be(), 2, 5, 8, 2, nullptr, true);
}

TEST_F(CpuBackendTest, AttentionAlibi) {
  const float slopes[2] = {0.5f, 0.125f};
  CheckAttention(be(), 2, 5, 8, 2, slopes, true);
}

// T spans several 64-row blocks, the last one partial.
TEST_F(CpuBackendTest, AttentionLongSequence) {
  const float slopes[2] = {0.25f, 0.0625f};
  CheckAttention(be(), 1, 150, 16, 2, nullptr, false);
  CheckAttention(be(), 2, 130, 16, 2, slopes, false);
}

// ---- pointwise ------------------------------------------------------------------------------

TEST_F(CpuBackendTest, Gelu) {
  const size_t n = 80;
  Floats inp(be(), RandomVec(n, -4, 4, 19)), out(be(), n);
  be_->GeluForward(out.data(), inp.data(), n);
  std::vector<double> want(n);
  for (size_t i = 0; i < n; i++) {
    const double x = inp[i];
    want[i] = 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
  }
  ExpectAllNear(out.vec(), want, 1e-6, "out");

  const std::vector<float> r = RandomVec(n, -1, 1, 20);
  Floats dout(be(), r), dinp(be(), n);
  be_->GeluBackward(dinp.data(), inp.data(), dout.data(), n);
  auto loss = [&] {
    be_->GeluForward(out.data(), inp.data(), n);
    return Weighted(out.data(), r);
  };
  ExpectGradMatchesFiniteDiff("dinp", inp.data(), n, dinp.vec(), loss, 1e-3f);
  const std::vector<float> d1 = dinp.vec();
  be_->GeluBackward(dinp.data(), inp.data(), dout.data(), n);
  ExpectDoubled(d1, dinp.vec(), "dinp");
}

// Long arrays (several chunks, both threads) and the saturated tails, against double tanh.
TEST_F(CpuBackendTest, GeluLongAndExtreme) {
  std::vector<float> x = RandomVec(50000, -12, 12, 41);
  const std::vector<float> extremes = {0.0f, -0.0f, 1e-6f, -1e-6f, 30.0f, -30.0f,
                                       1e3f, -1e3f, 1e13f, -1e13f, 1e-30f};
  std::copy(extremes.begin(), extremes.end(), x.begin());
  Floats inp(be(), x), out(be(), x.size()), dinp(be(), x.size()), dout(be(), x.size());
  std::fill(dout.data(), dout.data() + dout.size(), 1.0f);
  be_->GeluForward(out.data(), inp.data(), x.size());
  be_->GeluBackward(dinp.data(), inp.data(), dout.data(), x.size());
  std::vector<double> want(x.size()), want_grad(x.size());
  const double k = std::sqrt(2 / M_PI), c = 0.044715;
  for (size_t i = 0; i < x.size(); i++) {
    const double v = x[i], th = std::tanh(k * (v + c * v * v * v));
    want[i] = 0.5 * v * (1 + th);
    want_grad[i] = 0.5 * (1 + th) + 0.5 * v * (1 - th * th) * k * (1 + 3 * c * v * v);
  }
  ExpectAllNear(out.vec(), want, 1e-6, "gelu");
  ExpectAllNear(dinp.vec(), want_grad, 1e-5, "dgelu");
}

// ---- loss -----------------------------------------------------------------------------------

TEST_F(CpuBackendTest, CrossEntropy) {
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
  for (int i = 0; i < N; i++) {
    double mx = -INFINITY, sum = 0;
    for (int j = 0; j < V; j++) mx = std::max(mx, double(logits[i * Vp + j]));
    for (int j = 0; j < V; j++) sum += std::exp(logits[i * Vp + j] - mx);
    const double lz = mx + std::log(sum);
    EXPECT_NEAR(logz[i], lz, 1e-5);
    EXPECT_NEAR(losses[i], -std::log(std::exp(logits[i * Vp + tgt[i]] - lz)), 1e-5);
    double psum = 0;
    for (int j = 0; j < V; j++) {
      const double p = std::exp(logits[i * Vp + j] - lz);
      psum += lg[i * Vp + j] / dloss + (j == tgt[i]);
      EXPECT_NEAR(lg[i * Vp + j], (p - (j == tgt[i])) * dloss, 1e-6);
    }
    EXPECT_NEAR(psum, 1.0, 1e-5);
    for (int j = V; j < Vp; j++) EXPECT_EQ(lg[i * Vp + j], 0.0f);  // padding: zero gradient
  }

  // Gradient against finite differences of dloss * sum_i loss_i; logz is optional.
  const std::vector<float> grad = lg.vec();
  Floats work(be(), N * Vp);
  std::vector<float> x = logits;
  auto loss = [&] {
    work.Set(x);
    be_->CrossEntropyForwardBackward(losses.data(), nullptr, work.data(), targets.data(), N, V, Vp,
                                     dloss);
    double s = 0;
    for (int i = 0; i < N; i++) s += double(losses[i]) * dloss;
    return s;
  };
  std::vector<size_t> real;
  for (int i = 0; i < N; i++) {
    for (int j = 0; j < V; j++) real.push_back(i * Vp + j);
  }
  ExpectGradMatchesFiniteDiff("dlogits", x.data(), x.size(), grad, loss, 1e-2f, 2e-3, real);

  // A target outside the vocabulary is an error, not a silent out-of-bounds read.
  Ints bad(be(), std::vector<int32_t>{0, V, 1, 2});
  work.Set(logits);
  EXPECT_THROW(be_->CrossEntropyForwardBackward(losses.data(), nullptr, work.data(), bad.data(), N,
                                                V, Vp, dloss),
               KeelError);
}

// A realistic vocabulary row (vectorised path) against double-precision log-softmax.
TEST_F(CpuBackendTest, CrossEntropyLargeVocab) {
  const int N = 3, V = 1003, Vp = 1024;
  const float dloss = 0.5f;
  std::vector<float> logits = RandomVec(N * Vp, -20, 20, 42);
  const std::vector<int32_t> tgt = {0, 500, V - 1};
  Ints targets(be(), tgt);
  Floats lg(be(), logits), losses(be(), N), logz(be(), N);
  be_->CrossEntropyForwardBackward(losses.data(), logz.data(), lg.data(), targets.data(), N, V, Vp,
                                   dloss);
  for (int i = 0; i < N; i++) {
    double mx = -INFINITY, sum = 0;
    for (int j = 0; j < V; j++) mx = std::max(mx, double(logits[i * Vp + j]));
    for (int j = 0; j < V; j++) sum += std::exp(logits[i * Vp + j] - mx);
    const double lz = mx + std::log(sum);
    EXPECT_NEAR(logz[i], lz, 1e-5 * std::abs(lz));
    EXPECT_NEAR(losses[i], lz - logits[i * Vp + tgt[i]], 1e-5 * std::max(1.0, std::abs(lz)));
    for (int j = 0; j < V; j++) {
      const double p = std::exp(logits[i * Vp + j] - lz);
      ASSERT_NEAR(lg[i * Vp + j], (p - (j == tgt[i])) * dloss, 1e-6) << i << "," << j;
    }
    for (int j = V; j < Vp; j++) EXPECT_EQ(lg[i * Vp + j], 0.0f);
  }
}

TEST_F(CpuBackendTest, Softmax) {
  const int V = 9;
  const float temp = 0.7f;
  Floats logits(be(), RandomVec(V, -3, 3, 22)), probs(be(), V);
  be_->Softmax(probs.data(), logits.data(), V, temp);
  double mx = -INFINITY, sum = 0;
  for (int j = 0; j < V; j++) mx = std::max(mx, double(logits[j]) / temp);
  for (int j = 0; j < V; j++) sum += std::exp(logits[j] / double(temp) - mx);
  for (int j = 0; j < V; j++) {
    EXPECT_NEAR(probs[j], std::exp(logits[j] / double(temp) - mx) / sum, 1e-6);
  }
}

// ---- reductions and the optimizer -----------------------------------------------------------

TEST_F(CpuBackendTest, Reductions) {
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
  EXPECT_EQ(be_->SumSquares(dx.data(), n), want);
  EXPECT_EQ(be_->CountZeros(dx.data(), n), zeros);
  EXPECT_EQ(be_->CountNonFinite(dx.data(), n), 0u);
  dx[5] = std::numeric_limits<float>::quiet_NaN();
  dx[70000] = std::numeric_limits<float>::infinity();
  dx[n - 1] = -std::numeric_limits<float>::infinity();
  dx[6] = std::numeric_limits<float>::max();         // finite
  dx[7] = std::numeric_limits<float>::denorm_min();  // finite, not zero
  dx[8] = -0.0f;                                     // a zero
  EXPECT_EQ(be_->CountNonFinite(dx.data(), n), 3u);
  size_t zeros2 = 0;
  for (size_t i = 0; i < n; i++) zeros2 += dx[i] == 0.0f;
  EXPECT_EQ(be_->CountZeros(dx.data(), n), zeros2);
  EXPECT_EQ(be_->SumSquares(dx.data(), 0), 0.0);
  EXPECT_EQ(be_->CountZeros(dx.data(), 0), 0u);
}

TEST_F(CpuBackendTest, AdamW) {
  const size_t n = 100;
  const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  Floats p(be(), RandomVec(n, -1, 1, 23)), g(be(), RandomVec(n, -1, 1, 24)),
      m(be(), RandomVec(n, -0.1f, 0.1f, 25)), v(be(), RandomVec(n, 0, 0.01f, 26));
  const std::vector<float> p0 = p.vec(), m0 = m.vec(), v0 = v.vec();
  std::vector<double> rp(p0.begin(), p0.end()), rm(m0.begin(), m0.end()), rv(v0.begin(), v0.end());
  for (int64_t step = 1; step <= 3; step++) {
    be_->AdamWUpdate(p.data(), g.data(), m.data(), v.data(), n, lr, b1, b2, eps, wd, step);
    for (size_t i = 0; i < n; i++) {
      const double gi = g[i];
      rm[i] = double(b1) * rm[i] + (1 - double(b1)) * gi;
      rv[i] = double(b2) * rv[i] + (1 - double(b2)) * gi * gi;
      const double mhat = rm[i] / (1 - std::pow(double(b1), step));
      const double vhat = rv[i] / (1 - std::pow(double(b2), step));
      rp[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * rp[i]);
    }
    ExpectAllNear(p.vec(), rp, 1e-5, "param");
    ExpectAllNear(m.vec(), rm, 1e-5, "m");
    ExpectAllNear(v.vec(), rv, 1e-5, "v");
  }
}

// The guard's signals measured inside the update: same update bits as without them, and the
// sums and max equal direct computations; 1 and 2 threads give the same sums.
TEST_F(CpuBackendTest, AdamWStatsMeasureTheUpdateWithoutChangingIt) {
  const size_t n = 70000;  // several reduction chunks
  const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  std::unique_ptr<Backend> one = MakeCpuBackend(1);
  std::vector<double> update_sq, param_sq;
  for (Backend* k : {be(), one.get()}) {
    Floats p(k, RandomVec(n, -1, 1, 23)), g(k, RandomVec(n, -1, 1, 24)),
        m(k, RandomVec(n, -0.1f, 0.1f, 25)), v(k, RandomVec(n, 0, 0.01f, 26));
    Floats p2(k, p.vec()), m2(k, m.vec()), v2(k, v.vec());
    const std::vector<float> old = p.vec();
    Backend::AdamWStats st;
    st.max_v = 0;
    k->AdamWUpdate(p.data(), g.data(), m.data(), v.data(), n, lr, b1, b2, eps, wd, 2, &st);
    k->AdamWUpdate(p2.data(), g.data(), m2.data(), v2.data(), n, lr, b1, b2, eps, wd, 2);
    EXPECT_EQ(p.vec(), p2.vec());
    EXPECT_EQ(v.vec(), v2.vec());
    double du = 0, dp = 0;
    float vmax = 0;
    for (size_t i = 0; i < n; i++) {
      du += (double(p[i]) - old[i]) * (double(p[i]) - old[i]);
      dp += double(p[i]) * p[i];
      vmax = std::max(vmax, v[i]);
    }
    EXPECT_NEAR(st.update_sq, du, 1e-4 * du);  // float differences and sums within a chunk
    EXPECT_NEAR(st.param_sq, dp, 1e-4 * dp);
    EXPECT_EQ(st.max_v, vmax);
    update_sq.push_back(st.update_sq);
    param_sq.push_back(st.param_sq);
  }
  EXPECT_EQ(update_sq[0], update_sq[1]);
  EXPECT_EQ(param_sq[0], param_sq[1]);
}

// ---- determinism ----------------------------------------------------------------------------

// Each op run twice on the same inputs gives the same bits; thread-count-independent reductions
// also match between 1 and 2 threads.
TEST_F(CpuBackendTest, Deterministic) {
  std::unique_ptr<Backend> one = MakeCpuBackend(1);
  const int B = 2, T = 96, C = 128, NH = 4, N = B * T, V = 100, Vp = 128;
  std::vector<int32_t> tok(N);
  for (int i = 0; i < N; i++) tok[i] = (i * 37) % V;
  Ints tokens(be(), tok);
  Floats x(be(), RandomVec(N * C, -1, 1, 30)), dy(be(), RandomVec(N * C, -1, 1, 31)),
      w(be(), RandomVec(C, 0.5, 1.5, 32)), b(be(), RandomVec(C, -1, 1, 33)),
      wm(be(), RandomVec(3 * C * C, -0.1f, 0.1f, 34)), bm(be(), RandomVec(3 * C, -1, 1, 35)),
      dy3(be(), RandomVec(N * 3 * C, -1, 1, 36)), wte(be(), RandomVec(V * C, -1, 1, 37)),
      wpe(be(), RandomVec(T * C, -1, 1, 38)), logits(be(), RandomVec(N * Vp, -4, 4, 39));
  const float slopes[NH] = {0.5f, 0.25f, 0.125f, 0.0625f};

  // Runs everything on backend `k`, returns all outputs concatenated.
  auto run = [&](Backend* k) {
    std::vector<float> all;
    auto take = [&](const Floats& f) { all.insert(all.end(), f.data(), f.data() + f.size()); };
    Floats emb(be(), N * C), dwte(be(), V * C), dwpe(be(), T * C);
    k->EmbeddingForward(emb.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    k->EmbeddingBackward(dwte.data(), dwpe.data(), dy.data(), tokens.data(), B, T, C);
    Floats ln(be(), N * C), mean(be(), N), rstd(be(), N), dx(be(), N * C), dw(be(), C), db(be(), C);
    k->LayerNormForward(ln.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                        1e-5f);
    k->LayerNormBackward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(),
                         mean.data(), rstd.data(), N, C);
    Floats qkv(be(), N * 3 * C), dln(be(), N * C), dwm(be(), 3 * C * C), dbm(be(), 3 * C);
    k->MatmulForward(qkv.data(), ln.data(), wm.data(), bm.data(), N, C, 3 * C);
    k->MatmulBackward(dln.data(), dwm.data(), dbm.data(), dy3.data(), ln.data(), wm.data(), N, C,
                      3 * C);
    Floats att(be(), size_t(B) * NH * T * T), ao(be(), N * C), dqkv(be(), N * 3 * C);
    k->AttentionForward(ao.data(), att.data(), qkv.data(), slopes, B, T, C, NH);
    k->AttentionBackward(dqkv.data(), dy.data(), qkv.data(), att.data(), B, T, C, NH);
    Floats gl(be(), N * C), dg(be(), N * C);
    k->GeluForward(gl.data(), x.data(), N * C);
    k->GeluBackward(dg.data(), x.data(), dy.data(), N * C);
    Floats lg(be(), logits.vec()), losses(be(), N), lz(be(), N);
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
  EXPECT_TRUE(SameBits(r1.data(), r2.data(), r1.size()));

  // Reductions designed to be independent of the thread count.
  Floats big(be(), RandomVec(300000, -3, 3, 40));
  const double s2 = be_->SumSquares(big.data(), big.size());
  const double s1 = one->SumSquares(big.data(), big.size());
  EXPECT_EQ(std::memcmp(&s1, &s2, sizeof(double)), 0);
  EXPECT_EQ(be_->SumSquares(big.data(), big.size()), s2);
  {
    Floats a1(be(), V * C), a2(be(), V * C), p1(be(), T * C), p2(be(), T * C);
    be_->EmbeddingBackward(a2.data(), p2.data(), dy.data(), tokens.data(), B, T, C);
    one->EmbeddingBackward(a1.data(), p1.data(), dy.data(), tokens.data(), B, T, C);
    EXPECT_TRUE(SameBits(a1.data(), a2.data(), a1.size()));
    EXPECT_TRUE(SameBits(p1.data(), p2.data(), p1.size()));
  }
  {
    Floats mean(be(), N), rstd(be(), N), ln(be(), N * C);
    be_->LayerNormForward(ln.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                          1e-5f);
    Floats dw1(be(), C), db1(be(), C), dw2(be(), C), db2(be(), C);
    be_->LayerNormBackward(nullptr, dw2.data(), db2.data(), dy.data(), x.data(), w.data(),
                           mean.data(), rstd.data(), N, C);
    one->LayerNormBackward(nullptr, dw1.data(), db1.data(), dy.data(), x.data(), w.data(),
                           mean.data(), rstd.data(), N, C);
    EXPECT_TRUE(SameBits(dw1.data(), dw2.data(), C));
    EXPECT_TRUE(SameBits(db1.data(), db2.data(), C));
  }
  {
    Floats d1(be(), 3 * C), d2(be(), 3 * C), dw1(be(), 3 * C * C), dw2(be(), 3 * C * C);
    be_->MatmulBackward(nullptr, dw2.data(), d2.data(), dy3.data(), x.data(), wm.data(), N, C,
                        3 * C);
    one->MatmulBackward(nullptr, dw1.data(), d1.data(), dy3.data(), x.data(), wm.data(), N, C,
                        3 * C);
    EXPECT_TRUE(SameBits(d1.data(), d2.data(), d1.size()));
  }
}

}  // namespace
}  // namespace keel

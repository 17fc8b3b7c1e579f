// The whole model against an independent reference: a naive double-precision GPT written here
// from the formulas (not from keel's ops). Checks the loss and logits of the forward, and every
// parameter gradient of keel's backward against central finite differences of the reference.
// Runs on every backend of tests/backend/test_backends.h (data moves through the backend's copies
// only), with that backend's tolerance scale.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "../backend/test_backends.h"
#include "backend/backend.h"
#include "core/rng.h"
#include "model/gpt.h"
#include "optim/adamw.h"

namespace keel {
namespace {

using testing_backends::TestBackend;
using testing_backends::TestBackends;
using Vec = std::vector<double>;

struct RefModel {
  GptSpec s;
  std::map<std::string, const double*> p;  // name -> parameter data
};

// y = LN(x) over rows of length C; with rms, y = x / sqrt(mean(x^2) + eps) * w (RMSNorm, no bias).
Vec LayerNorm(const Vec& x, const double* w, const double* b, int N, int C, double eps,
              bool rms = false) {
  Vec y(x.size());
  for (int i = 0; i < N; ++i) {
    double mean = 0, var = 0;
    if (rms) {
      for (int c = 0; c < C; ++c) var += x[i * C + c] * x[i * C + c];
    } else {
      for (int c = 0; c < C; ++c) mean += x[i * C + c];
      mean /= C;
      for (int c = 0; c < C; ++c) var += (x[i * C + c] - mean) * (x[i * C + c] - mean);
    }
    var /= C;
    const double rstd = 1.0 / std::sqrt(var + eps);
    for (int c = 0; c < C; ++c)
      y[i * C + c] = (x[i * C + c] - mean) * rstd * w[c] + (rms ? 0.0 : b[c]);
  }
  return y;
}

// y (N,OC) = x (N,IC) W(OC,IC)^T + b
Vec Linear(const Vec& x, const double* W, const double* b, int N, int IC, int OC) {
  Vec y(static_cast<size_t>(N) * OC);
  for (int i = 0; i < N; ++i)
    for (int o = 0; o < OC; ++o) {
      double acc = b ? b[o] : 0.0;
      for (int k = 0; k < IC; ++k) acc += x[i * IC + k] * W[o * IC + k];
      y[i * OC + o] = acc;
    }
  return y;
}

// The objective: mean cross-entropy, plus z_loss * mean (log Z)^2 (returned in *z_out too).
double RefLoss(const RefModel& m, const std::vector<int32_t>& tok, const std::vector<int32_t>& tgt,
               int B, int T, std::vector<double>* logits_out = nullptr, double* z_out = nullptr) {
  const GptSpec& s = m.s;
  const int C = s.hidden, NH = s.heads, hs = C / NH, N = B * T, F = s.ffn_hidden;
  const int G = s.KvHeads();        // key/value heads
  const int W = (NH + 2 * G) * hs;  // q heads, then k heads, then v heads
  auto P = [&](const std::string& n) { return m.p.at(n); };
  // Tensors a shape may lack (biases, norm biases): null then.
  auto Opt = [&](const std::string& n) -> const double* {
    auto it = m.p.find(n);
    return it == m.p.end() ? nullptr : it->second;
  };
  auto Norm = [&](const Vec& x, const std::string& name, int rows, int cols) {
    return LayerNorm(x, P(name + ".weight"), Opt(name + ".bias"), rows, cols, s.layernorm_eps,
                     s.rmsnorm);
  };
  // Packed documents: start[b*T+t] = first token of t's document (after the last EOD before t).
  std::vector<int> start(static_cast<size_t>(N), 0);
  for (int b = 0; b < B; ++b)
    for (int t = 1; t < T; ++t)
      start[b * T + t] = tok[b * T + t - 1] == s.eod_id ? t : start[b * T + t - 1];
  auto position = [&](int b, int t) { return s.reset_position_ids ? t - start[b * T + t] : t; };
  Vec x(static_cast<size_t>(N) * C);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c) {
        double v = P("embedding.word_embeddings.weight")[tok[b * T + t] * C + c];
        if (!s.alibi && !s.rope)
          v += P("embedding.position_embeddings.weight")[position(b, t) * C + c];
        x[(b * T + t) * C + c] = v;
      }
  if (s.embed_layernorm) x = Norm(x, "embedding.layernorm", N, C);
  std::vector<float> slopes = s.alibi ? AlibiSlopes(NH) : std::vector<float>();
  for (int l = 0; l < s.num_layers; ++l) {
    const std::string pre = "layers." + std::to_string(l) + ".";
    Vec h = Norm(x, pre + "input_layernorm", N, C);
    Vec qkv = Linear(h, P(pre + "attention.query_key_value.weight"),
                     Opt(pre + "attention.query_key_value.bias"), N, C, W);
    if (s.qk_layernorm) {
      // Each query head and each key head, LayerNorm-ed over the head dimension (weights shared).
      for (int part = 0; part < 2; ++part) {
        const std::string nm =
            pre + (part == 0 ? "attention.q_layernorm." : "attention.k_layernorm.");
        Vec seg(hs);
        for (int n = 0; n < N; ++n)
          for (int hd = 0; hd < (part == 0 ? NH : G); ++hd) {
            double* at = &qkv[static_cast<size_t>(n) * W + (part * NH + hd) * hs];
            seg.assign(at, at + hs);
            const Vec y = LayerNorm(seg, P(nm + "weight"), P(nm + "bias"), 1, hs, s.layernorm_eps);
            std::copy(y.begin(), y.end(), at);
          }
      }
    }
    if (s.rope) {
      // Rotary positions ("rotate half"): in each query and key head, dims i and i + rot/2 turn by
      // pos * base^(-2i/rot), for i < rot/2 (rot = the even part of hs * rotary_percent).
      const int rot = static_cast<int>(hs * s.rotary_percent) / 2 * 2, half = rot / 2;
      for (int b = 0; b < B; ++b)
        for (int t = 0; t < T; ++t)
          for (int hd = 0; hd < NH + G; ++hd) {
            double* v = &qkv[static_cast<size_t>(b * T + t) * W + hd * hs];
            for (int i = 0; i < half; ++i) {
              const double th = position(b, t) * std::pow(s.rotary_base, -2.0 * i / rot);
              const double x1 = v[i], x2 = v[i + half];
              v[i] = x1 * std::cos(th) - x2 * std::sin(th);
              v[i + half] = x2 * std::cos(th) + x1 * std::sin(th);
            }
          }
    }
    Vec y(static_cast<size_t>(N) * C, 0.0);
    const double sc = std::pow(static_cast<double>(hs), -0.25);
    for (int b = 0; b < B; ++b)
      for (int hd = 0; hd < NH; ++hd) {
        const int kh = NH + hd / (NH / G), vh = NH + G + hd / (NH / G);  // its key, value heads
        for (int i = 0; i < T; ++i) {
          std::vector<double> sco(i + 1);
          double mx = -1e300;
          const int j0 = s.reset_attention_mask ? start[b * T + i] : 0;
          for (int j = j0; j <= i; ++j) {
            double d = 0;
            for (int k = 0; k < hs; ++k)
              d += (qkv[(b * T + i) * W + hd * hs + k] * sc) *
                   (qkv[(b * T + j) * W + kh * hs + k] * sc);
            if (s.alibi) d -= slopes[hd] * (i - j);
            sco[j] = d;
            mx = std::max(mx, d);
          }
          double z = 0;
          for (int j = j0; j <= i; ++j) z += sco[j] = std::exp(sco[j] - mx);
          for (int j = j0; j <= i; ++j)
            for (int k = 0; k < hs; ++k)
              y[(b * T + i) * C + hd * hs + k] += sco[j] / z * qkv[(b * T + j) * W + vh * hs + k];
        }
      }
    Vec a =
        Linear(y, P(pre + "attention.dense.weight"), Opt(pre + "attention.dense.bias"), N, C, C);
    for (size_t i = 0; i < x.size(); ++i) x[i] += a[i];
    h = Norm(x, pre + "post_attention_layernorm", N, C);
    const int F1 = s.swiglu ? 2 * F : F;
    Vec f = Linear(h, P(pre + "mlp.dense_h_to_4h.weight"), Opt(pre + "mlp.dense_h_to_4h.bias"), N,
                   C, F1);
    Vec act(static_cast<size_t>(N) * F);
    for (int n = 0; n < N; ++n)
      for (int i = 0; i < F; ++i) {
        if (s.swiglu) {  // silu(gate) * up, gate the first F outputs
          const double g = f[n * F1 + i], u = f[n * F1 + F + i];
          act[n * F + i] = g / (1.0 + std::exp(-g)) * u;
        } else {
          const double v = f[n * F1 + i];
          act[n * F + i] =
              0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
        }
      }
    Vec o = Linear(act, P(pre + "mlp.dense_4h_to_h.weight"), Opt(pre + "mlp.dense_4h_to_h.bias"), N,
                   F, C);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
  }
  x = Norm(x, "final_layernorm", N, C);
  Vec logits = Linear(
      x, s.untie_embeddings ? P("output_layer.weight") : P("embedding.word_embeddings.weight"),
      nullptr, N, C, s.padded_vocab);
  if (logits_out) *logits_out = logits;
  double loss = 0, zl = 0;
  for (int i = 0; i < N; ++i) {
    double mx = -1e300, z = 0;
    for (int v = 0; v < s.vocab; ++v) mx = std::max(mx, logits[i * s.padded_vocab + v]);
    for (int v = 0; v < s.vocab; ++v) z += std::exp(logits[i * s.padded_vocab + v] - mx);
    loss += -(logits[i * s.padded_vocab + tgt[i]] - mx - std::log(z));
    const double log_z = mx + std::log(z);
    zl += log_z * log_z;
  }
  zl *= s.z_loss / N;
  if (z_out) *z_out = zl;
  return loss / N + zl;
}

struct Case {
  bool alibi = false, embed_ln = false, qk_ln = false;
  float z_loss = 0.0f;
  bool reset_docs = false;  // --reset-position-ids and --reset-attention-mask
  // The Llama family's options.
  bool rope = false;
  double rotary_percent = 1.0;
  bool rmsnorm = false, swiglu = false;
  int kv_heads = 0;  // of the test's 2 heads (4 with kv_heads 2)
  bool untie = false, no_bias = false;
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << "alibi=" << c.alibi << " embed_ln=" << c.embed_ln << " qk_ln=" << c.qk_ln
      << " z_loss=" << c.z_loss << " reset_docs=" << c.reset_docs << " rope=" << c.rope
      << " rotary_percent=" << c.rotary_percent << " rmsnorm=" << c.rmsnorm
      << " swiglu=" << c.swiglu << " kv_heads=" << c.kv_heads << " untie=" << c.untie
      << " no_bias=" << c.no_bias;
}

class GptReferenceTest : public ::testing::TestWithParam<std::tuple<TestBackend, Case>> {
 protected:
  const Case& GetCase() const { return std::get<1>(GetParam()); }
  // A tolerance written for the fp32 CPU backend, scaled for this backend.
  double Tol(double fp32_tol) const {
    const auto& tol = std::get<0>(GetParam()).tol;
    return fp32_tol * tol.scale * tol.model;
  }
  void SetUp() override {  // a backend this machine lacks (CUDA without a GPU) skips
    const std::string why = testing_backends::Unavailable(std::get<0>(GetParam()));
    if (!why.empty()) GTEST_SKIP() << why;
  }
};

TEST_P(GptReferenceTest, ForwardAndEveryGradientMatchReference) {
  GptSpec s;
  s.num_layers = 2;
  s.hidden = 8;
  s.ffn_hidden = 20;  // deliberately not 4h
  s.heads = 2;
  s.max_positions = 6;
  s.vocab = 13;
  s.padded_vocab = 16;
  s.alibi = GetCase().alibi;
  s.embed_layernorm = GetCase().embed_ln;
  s.qk_layernorm = GetCase().qk_ln;
  s.z_loss = GetCase().z_loss;
  s.reset_position_ids = s.reset_attention_mask = GetCase().reset_docs;
  s.eod_id = 3;
  s.rope = GetCase().rope;
  s.rotary_base = 100;  // a small base turns even these few positions by a lot
  s.rotary_percent = GetCase().rotary_percent;
  s.rmsnorm = GetCase().rmsnorm;
  s.swiglu = GetCase().swiglu;
  s.SetKvHeads(GetCase().kv_heads);
  if (GetCase().kv_heads == 2) s.heads = 4;  // 4 query heads of hs 2 sharing 2 key/value heads
  s.untie_embeddings = GetCase().untie;
  s.bias = !GetCase().no_bias;
  const int B = 2, T = 5, N = B * T;
  std::unique_ptr<Backend> be = std::get<0>(GetParam()).make(2);
  GptModel model(be.get(), s);
  model.Initialize(7, 0.3f);  // large std so every path carries signal
  // Non-trivial norms and biases too.
  std::vector<float> host(model.num_params());
  be->CopyToHost(host.data(), model.param_data(), host.size());
  for (size_t i = 0; i < host.size(); ++i)
    host[i] += 0.05f * NormalAt({3, RngPurpose::kTest, 1}, i);
  be->CopyToDevice(model.mutable_param_data(), host.data(), host.size());

  std::vector<int32_t> tok(N), tgt(N);
  for (int i = 0; i < N; ++i) {
    tok[i] = static_cast<int32_t>(U64At({1, RngPurpose::kTest, 2}, i) % s.vocab);
    tgt[i] = static_cast<int32_t>(U64At({1, RngPurpose::kTest, 3}, i) % s.vocab);
    if (tok[i] == s.eod_id) tok[i] = 4;
  }
  if (GetCase().reset_docs) {
    // Documents [0,1,2] [3,4] in sequence 0; [0] [1,2,3] [4] in sequence 1.
    tok[2] = tok[T] = tok[T + 3] = s.eod_id;
  }
  model.ZeroGrad();
  const double loss = model.Forward(tok.data(), tgt.data(), B, T, 1.0f / N);
  model.Backward();
  std::vector<float> grad(model.num_params());
  be->CopyToHost(grad.data(), model.grad_data(), grad.size());

  std::vector<double> dp(host.begin(), host.end());
  RefModel ref{s, {}};
  for (const ParamInfo& p : model.params()) ref.p[p.name] = dp.data() + p.offset;
  double ref_z = 0;
  const double ref_loss = RefLoss(ref, tok, tgt, B, T, nullptr, &ref_z);
  EXPECT_NEAR(loss, ref_loss - ref_z, Tol(1e-5) * std::abs(ref_loss));  // Forward reports lm loss
  EXPECT_NEAR(model.LastZLoss(), ref_z, Tol(1e-5) * std::abs(ref_z) + 1e-12);
  if (s.z_loss > 0) {
    EXPECT_GT(ref_z, 1e-3);  // the term is large enough to test its gradient
  }

  // Logits: a Forward without targets keeps them.
  model.Forward(tok.data(), nullptr, B, T, 0.0f);
  std::vector<double> ref_logits;
  RefLoss(ref, tok, tgt, B, T, &ref_logits);
  for (int i = 0; i < N; ++i) {
    std::vector<float> row = model.LogitsAt(i / T, i % T);
    for (int v = 0; v < s.vocab; ++v)
      EXPECT_NEAR(row[v], ref_logits[i * s.padded_vocab + v], Tol(1e-4));
  }

  // Every parameter's gradient vs central differences of the double-precision reference. A
  // mixed-precision backend also meets a bound on each tensor's relative L2 error (its elements'
  // tolerances are loose: one rounding of a small gradient is a large relative error).
  const double eps = 1e-5;
  const double products = std::get<0>(GetParam()).tol.products;
  for (const ParamInfo& p : model.params()) {
    double err_sq = 0, ref_sq = 0;
    for (size_t k = 0; k < p.numel; ++k) {
      double& w = dp[p.offset + k];
      const double keep = w;
      w = keep + eps;
      const double lp = RefLoss(ref, tok, tgt, B, T);
      w = keep - eps;
      const double lm = RefLoss(ref, tok, tgt, B, T);
      w = keep;
      const double numeric = (lp - lm) / (2 * eps);
      const double analytic = grad[p.offset + k];
      ASSERT_NEAR(analytic, numeric, Tol(2e-4 + 2e-3 * std::abs(numeric)))
          << p.name << "[" << k << "]";
      err_sq += (analytic - numeric) * (analytic - numeric);
      ref_sq += numeric * numeric;
    }
    // Softmax ignores a shift of every key, so the key LayerNorm's bias has a gradient only
    // through RoPE's position-dependent turn of it (0 without RoPE): a residue of cancellation,
    // whose relative error says nothing of the products' precision.
    const bool cancels = p.name.find("k_layernorm.bias") != std::string::npos;
    if (products > 0 && ref_sq > 1e-12 && !cancels) {
      EXPECT_LT(std::sqrt(err_sq / ref_sq), 4 * products) << p.name << " (relative L2 error)";
    }
  }
}

// Names: <backend>_<variant>, e.g. cpu_AlibiEmbedLN.
INSTANTIATE_TEST_SUITE_P(
    Variants, GptReferenceTest,
    ::testing::Combine(
        ::testing::ValuesIn(TestBackends()),
        ::testing::Values(Case{}, Case{.alibi = true}, Case{.embed_ln = true},
                          Case{.alibi = true, .embed_ln = true}, Case{.qk_ln = true},
                          Case{.z_loss = 0.05f},
                          Case{.alibi = true, .embed_ln = true, .qk_ln = true, .z_loss = 0.05f},
                          Case{.reset_docs = true}, Case{.alibi = true, .reset_docs = true},
                          // Llama: RoPE, RMSNorm, SwiGLU, one key/value head for both query
                          // heads, an untied output layer, no linear biases.
                          Case{.rope = true,
                               .rmsnorm = true,
                               .swiglu = true,
                               .kv_heads = 1,
                               .untie = true,
                               .no_bias = true},
                          // Llama-shaped with packed documents (positions restart) and z-loss,
                          // 4 query heads over 2 key/value heads.
                          Case{.z_loss = 0.05f,
                               .reset_docs = true,
                               .rope = true,
                               .rmsnorm = true,
                               .swiglu = true,
                               .kv_heads = 2,
                               .untie = true,
                               .no_bias = true},
                          // QK-LayerNorm over grouped heads; QK-LayerNorm then RoPE (head size 4:
                          // a LayerNorm over 2 values is +-1, ill-conditioned in bf16).
                          Case{.qk_ln = true, .kv_heads = 1}, Case{.qk_ln = true, .rope = true},
                          // Partial rotary, with GPT-2's LayerNorm, GELU, biases and tied output.
                          Case{.rope = true, .rotary_percent = 0.5},
                          // Each option on its own over GPT-2's shape.
                          Case{.swiglu = true}, Case{.embed_ln = true, .rmsnorm = true},
                          Case{.kv_heads = 1}, Case{.untie = true}, Case{.no_bias = true})),
    [](const auto& info) {
      const Case& c = std::get<1>(info.param);
      return std::get<0>(info.param).name + "_" +
             (c.alibi  ? "Alibi"
              : c.rope ? (c.rotary_percent < 1 ? "RopeHalf" : "Rope")
                       : "Learned") +
             (c.embed_ln ? "EmbedLN" : "") + (c.qk_ln ? "QkLN" : "") +
             (c.z_loss > 0 ? "ZLoss" : "") + (c.reset_docs ? "ResetDocs" : "") +
             (c.rmsnorm ? "RmsNorm" : "") + (c.swiglu ? "SwiGLU" : "") +
             (c.kv_heads > 0 ? "Gqa" + std::to_string(c.kv_heads) : "") +
             (c.untie ? "Untied" : "") + (c.no_bias ? "NoBias" : "");
    });

// The model's parameter layout and initialisation, on every backend (read back by CopyToHost).
class GptModelBackendTest : public ::testing::TestWithParam<TestBackend> {
 protected:
  void SetUp() override {  // a backend this machine lacks (CUDA without a GPU) skips
    const std::string why = testing_backends::Unavailable(GetParam());
    if (!why.empty()) GTEST_SKIP() << why;
  }
};

TEST_P(GptModelBackendTest, ParameterCountMatchesSeedsFormulaForStandardShape) {
  GptSpec s{3, 32, 128, 4, 16, 100, 128, false, false, 1e-5f};
  std::unique_ptr<Backend> be = GetParam().make(1);
  GptModel m(be.get(), s);
  EXPECT_EQ(static_cast<int64_t>(m.num_params()), GptModel::FormulaParamCount(s));
  s.ffn_hidden = 96;  // a stale FFN size is visible as a difference
  GptModel m2(be.get(), s);
  EXPECT_NE(static_cast<int64_t>(m2.num_params()), GptModel::FormulaParamCount(s));
}

TEST_P(GptModelBackendTest, InitialisationFollowsMegatron) {
  GptSpec s{4, 64, 256, 4, 16, 500, 512, false, false, 1e-5f};
  std::unique_ptr<Backend> be = GetParam().make(2);
  GptModel m(be.get(), s);
  m.Initialize(42, 0.02f);
  std::vector<float> h(m.num_params());
  be->CopyToHost(h.data(), m.param_data(), h.size());
  auto stddev = [&](const std::string& name) {
    const ParamInfo* p = m.FindParam(name);
    double ss = 0;
    for (size_t i = 0; i < p->numel; ++i) ss += h[p->offset + i] * h[p->offset + i];
    return std::sqrt(ss / p->numel);
  };
  EXPECT_NEAR(stddev("layers.0.mlp.dense_h_to_4h.weight"), 0.02, 0.001);
  EXPECT_NEAR(stddev("layers.0.mlp.dense_4h_to_h.weight"), 0.02 / std::sqrt(8.0), 0.0005);
  EXPECT_NEAR(stddev("layers.1.attention.dense.weight"), 0.02 / std::sqrt(8.0), 0.0008);
  EXPECT_EQ(stddev("layers.0.attention.query_key_value.bias"), 0.0);
  const ParamInfo* ln = m.FindParam("final_layernorm.weight");
  EXPECT_EQ(h[ln->offset], 1.0f);
  // Deterministic: same seed, same bits; other seed, other values.
  GptModel m2(be.get(), s);
  m2.Initialize(42, 0.02f);
  std::vector<float> h2(m.num_params());
  be->CopyToHost(h2.data(), m2.param_data(), h2.size());
  EXPECT_EQ(h, h2);
  m2.Initialize(43, 0.02f);
  be->CopyToHost(h2.data(), m2.param_data(), h2.size());
  EXPECT_NE(h, h2);
}

// A model with every kind of gradient: learned positions (or ALiBi), embedding and QK
// LayerNorms, biases, the tied embedding; and two micro-batches of tokens.
struct TwoMicroBatches {
  GptSpec spec;
  std::vector<int32_t> tok[2], tgt[2];
  static constexpr int B = 2, T = 5;
  explicit TwoMicroBatches(bool alibi) {
    spec = GptSpec{2, 16, 40, 2, 8, 13, 16, alibi, true, 1e-5f};
    spec.qk_layernorm = true;
    for (int m = 0; m < 2; ++m) {
      for (int i = 0; i < B * T; ++i) {
        tok[m].push_back(static_cast<int32_t>(U64At({5, RngPurpose::kTest, 2}, 100 * m + i) % 13));
        tgt[m].push_back(static_cast<int32_t>(U64At({5, RngPurpose::kTest, 3}, 100 * m + i) % 13));
      }
    }
  }
  void Run(GptModel& model) {
    for (int m = 0; m < 2; ++m) {
      model.Forward(tok[m].data(), tgt[m].data(), B, T, 0.05f);
      model.Backward();
    }
  }
};

// The step's first Backward after StartGradAccumulation writes every gradient: what ZeroGrad
// then the same Backwards give, whatever the buffer held before (here: 7s), for every tensor.
TEST_P(GptModelBackendTest, StartGradAccumulationWritesWhatZeroGradWould) {
  std::unique_ptr<Backend> be = GetParam().make(2);
  for (bool alibi : {false, true}) {
    SCOPED_TRACE(alibi ? "alibi" : "learned positions");
    TwoMicroBatches run(alibi);
    GptModel model(be.get(), run.spec);
    model.Initialize(3, 0.3f);
    const size_t n = model.num_params();
    model.ZeroGrad();
    run.Run(model);
    std::vector<float> want(n), got(n);
    be->CopyToHost(want.data(), model.grad_data(), n);
    const std::vector<float> stale(n, 7.0f);
    be->CopyToDevice(model.grad_data(), stale.data(), n);
    model.StartGradAccumulation();
    run.Run(model);
    be->CopyToHost(got.data(), model.grad_data(), n);
    for (const ParamInfo& p : model.params()) {
      for (size_t k = 0; k < p.numel; ++k) {
        ASSERT_EQ(got[p.offset + k], want[p.offset + k]) << p.name << "[" << k << "]";
      }
    }
    // Later Backwards add again: a third micro-batch changes the sums.
    model.Forward(run.tok[0].data(), run.tgt[0].data(), run.B, run.T, 0.05f);
    model.Backward();
    be->CopyToHost(got.data(), model.grad_data(), n);
    EXPECT_NE(got, want);
  }
}

// bf16/fp16: an optimizer that rewrites the weights' 16-bit copy as it updates them leaves the
// model exactly where a fresh conversion of the new weights would: same loss and logits bits.
TEST_P(GptModelBackendTest, UpdatingTheLowPrecisionCopyInPlaceMatchesConverting) {
  std::unique_ptr<Backend> be = GetParam().make(2);
  TwoMicroBatches run(false);
  GptModel fused(be.get(), run.spec), converted(be.get(), run.spec);
  AdamW opt_fused(be.get(), fused.num_params(), AdamWConfig{}),
      opt_converted(be.get(), converted.num_params(), AdamWConfig{});
  double loss[2] = {0, 0};
  for (int model = 0; model < 2; ++model) {
    GptModel& m = model == 0 ? fused : converted;
    AdamW& opt = model == 0 ? opt_fused : opt_converted;
    m.Initialize(3, 0.3f);
    for (int step = 0; step < 3; ++step) {
      m.StartGradAccumulation();
      run.Run(m);
      const GptModel::UpdatableWeights w =
          model == 0 ? m.weights_for_update()
                     : GptModel::UpdatableWeights{m.mutable_param_data(), nullptr};
      if (model == 0) {
        EXPECT_EQ(w.lowp != nullptr, be->precision() != Precision::kFp32);
      }
      opt.Step(w.fp32, m.grad_data(), m.params(), 1e-2, nullptr, 1.0f, w.lowp);
    }
    loss[model] = m.Forward(run.tok[1].data(), run.tgt[1].data(), run.B, run.T, 0.05f);
  }
  EXPECT_EQ(loss[0], loss[1]);
  EXPECT_EQ(fused.LastZLoss(), converted.LastZLoss());
  // Reading the weights (a save, a hash) leaves the copy current and converts nothing again...
  const int64_t conversions = fused.lowp_conversions();
  EXPECT_EQ(fused.param_data(), fused.weights_for_update().fp32);
  EXPECT_EQ(fused.weights_for_update().lowp != nullptr, be->precision() != Precision::kFp32);
  fused.Forward(run.tok[1].data(), run.tgt[1].data(), run.B, run.T, 0.05f);
  EXPECT_EQ(fused.lowp_conversions(), conversions);
  // ...whoever takes mutable_param_data() may write them: the copy is no longer current.
  fused.mutable_param_data();
  EXPECT_EQ(fused.weights_for_update().lowp, nullptr);
}

// Activation recomputation (selective: the attention probabilities; full: whole layers) gives
// the gradients, losses and guard signals of a run that keeps everything, bit for bit, over two
// accumulated micro-batches, in GPT-2's shape with BLOOM's and QK-LayerNorm's options and in the
// Llama family's.
TEST_P(GptModelBackendTest, RecomputationGivesTheSameBits) {
  std::unique_ptr<Backend> be = GetParam().make(2);
  for (bool llama : {false, true}) {
    SCOPED_TRACE(llama ? "llama" : "gpt");
    TwoMicroBatches run(llama);
    if (llama) {
      run.spec.alibi = run.spec.embed_layernorm = false;
      run.spec.rope = run.spec.rmsnorm = run.spec.swiglu = run.spec.untie_embeddings = true;
      run.spec.SetKvHeads(1);
      run.spec.bias = false;
      run.spec.num_layers = 3;
    }
    std::vector<float> want;
    double want_loss = 0, want_logit = 0;
    // Full recomputation of every layer (-1), and of the first 1 or 2 only (--recompute-method
    // block): the layers after them keep their own buffers.
    const std::vector<std::pair<Recompute, int>> modes = {{Recompute::kNone, -1},
                                                          {Recompute::kSelective, -1},
                                                          {Recompute::kFull, -1},
                                                          {Recompute::kFull, 1},
                                                          {Recompute::kFull, 2}};
    for (const auto& [r, full_layers] : modes) {
      SCOPED_TRACE(testing::Message() << RecomputeName(r) << " " << full_layers);
      GptModel model(be.get(), run.spec);
      model.set_recompute(r, full_layers);
      model.Initialize(3, 0.3f);
      model.StartGradAccumulation();
      run.Run(model);
      const double logit = model.LastMaxAttentionLogit();
      std::vector<float> grads(model.num_params());
      be->CopyToHost(grads.data(), model.grad_data(), grads.size());
      const double loss = model.Forward(run.tok[0].data(), run.tgt[0].data(), run.B, run.T, 0.05f);
      if (r == Recompute::kNone) {
        want = grads;
        want_loss = loss;
        want_logit = logit;
        continue;
      }
      for (const ParamInfo& p : model.params()) {
        for (size_t k = 0; k < p.numel; ++k) {
          ASSERT_EQ(grads[p.offset + k], want[p.offset + k]) << p.name << "[" << k << "]";
        }
      }
      EXPECT_EQ(loss, want_loss);
      EXPECT_EQ(logit, want_logit);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, GptModelBackendTest, ::testing::ValuesIn(TestBackends()),
                         [](const auto& info) { return info.param.name; });

// Llama 3.1 8B's RoPE (head 128, base 500000, scaling x8 of 8192 positions, bands 1 and 4):
// wavelengths 2 pi / w below 8192/4 are kept, above 8192/1 divided by 8, and in between blended
// by s = (8192 / wavelength - 1) / 3 (w (1 - s) / 8 + w s); the frequencies still fall strictly.
TEST(GptModelTest, RopeFrequenciesFollowLlama3ScalingAndLinearInterpolation) {
  GptSpec s;
  s.hidden = 4096;
  s.heads = 32;
  s.rope = true;
  s.rotary_base = 500000;
  const std::vector<double> plain = RopeFrequencies(s);
  ASSERT_EQ(plain.size(), 64u);
  for (int i = 0; i < 64; ++i) EXPECT_DOUBLE_EQ(plain[i], std::pow(500000.0, -i / 64.0));
  s.rope_llama3 = true;
  const std::vector<double> scaled = RopeFrequencies(s);
  int kept = 0, blended = 0, divided = 0;
  for (int i = 0; i < 64; ++i) {
    const double wavelength = 2 * M_PI / plain[i];
    if (wavelength < 2048) {
      EXPECT_EQ(scaled[i], plain[i]) << i;
      ++kept;
    } else if (wavelength > 8192) {
      EXPECT_DOUBLE_EQ(scaled[i], plain[i] / 8) << i;
      ++divided;
    } else {
      const double blend = (8192 / wavelength - 1) / 3;
      EXPECT_NEAR(scaled[i], plain[i] * ((1 - blend) / 8 + blend), 1e-12 * plain[i]) << i;
      ++blended;
    }
    if (i > 0) {
      EXPECT_LT(scaled[i], scaled[i - 1]) << i;
    }
  }
  EXPECT_EQ(kept, 29);
  EXPECT_EQ(blended, 6);
  EXPECT_EQ(divided, 29);
  // The table turns by the scaled frequencies.
  s.max_positions = 3;
  const std::vector<float> table = RopeCosSin(s);
  EXPECT_FLOAT_EQ(table[2 * 128 + 40], static_cast<float>(std::cos(2 * scaled[40])));
  EXPECT_FLOAT_EQ(table[2 * 128 + 64 + 40], static_cast<float>(std::sin(2 * scaled[40])));
  // Linear interpolation: every frequency over the factor (positions / factor).
  s.rope_llama3 = false;
  s.rope_interpolation_factor = 4;
  const std::vector<double> linear = RopeFrequencies(s);
  for (int i = 0; i < 64; ++i) EXPECT_DOUBLE_EQ(linear[i], plain[i] / 4) << i;
}

TEST(GptModelTest, AlibiSlopesMatchPaper) {
  std::vector<float> s8 = AlibiSlopes(8);
  for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(s8[i], std::pow(2.0f, -(i + 1.0f)));
  std::vector<float> s12 = AlibiSlopes(12);  // 8 geometric + 4 interleaved from the 16-head set
  ASSERT_EQ(s12.size(), 12u);
  EXPECT_FLOAT_EQ(s12[8], std::pow(2.0f, -0.5f));
  EXPECT_FLOAT_EQ(s12[9], std::pow(2.0f, -1.5f));
}

}  // namespace
}  // namespace keel

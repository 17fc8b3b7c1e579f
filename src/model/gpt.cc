#include "model/gpt.h"

#include <algorithm>
#include <cmath>

#include "core/rng.h"
#include "core/status.h"

namespace keel {

// Offsets (in floats) of one layer's tensors inside the parameter buffer.
struct GptModel::LayerParams {
  size_t ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w, fcproj_b;
};

// Everything the backward pass needs from the forward, plus gradient scratch, for one (B,T).
struct GptModel::Activations {
  float* emb = nullptr;       // (N,C) embedding sum; the LN input when embed_layernorm
  float* emb_mean = nullptr;  // (N)
  float* emb_rstd = nullptr;  // (N)
  std::vector<float*> res;    // L+1 residual streams (N,C); res[0] is the layer-0 input
  struct Layer {
    float *ln1 = nullptr, *ln1_mean = nullptr, *ln1_rstd = nullptr, *qkv = nullptr, *att = nullptr,
          *atty = nullptr, *res2 = nullptr, *ln2 = nullptr, *ln2_mean = nullptr,
          *ln2_rstd = nullptr, *fch = nullptr, *fch_gelu = nullptr;
    // qk_layernorm: qkv holds the normalised q,k (what attention reads), qkv_raw the matmul's
    // output; qk_mean/qk_rstd (2,N,NH). Null otherwise.
    float *qkv_raw = nullptr, *qk_mean = nullptr, *qk_rstd = nullptr;
    float* max_logit = nullptr;  // (B*NH) per (sequence, head) of this layer
  };
  std::vector<Layer> layers;
  float *lnf = nullptr, *lnf_mean = nullptr, *lnf_rstd = nullptr, *logits = nullptr,
        *losses = nullptr, *logz = nullptr;
  int32_t *tokens = nullptr, *targets = nullptr;
  // (N) per-document positions and first tokens, when reset
  int32_t *positions = nullptr, *doc_start = nullptr;
  // gradient scratch, reused by every layer
  float *dres_a = nullptr, *dres_b = nullptr, *dres2 = nullptr, *dln = nullptr, *dqkv = nullptr,
        *datty = nullptr, *dfch = nullptr, *dgelu = nullptr, *demb = nullptr;
  float* dqkv_raw = nullptr;  // qk_layernorm: gradient w.r.t. the matmul's qkv
  std::vector<float> host_losses;
};

// Where LayoutActivations gets each buffer: from the backend, or (no backend) nowhere, only
// counting the bytes.
struct GptModel::BufferSource {
  Backend* backend = nullptr;
  uint64_t bytes = 0;
  float* Floats(size_t n) {
    bytes += n * sizeof(float);
    return backend != nullptr ? backend->AllocFloats(n) : nullptr;
  }
  int32_t* Ints(size_t n) {
    bytes += n * sizeof(int32_t);
    return backend != nullptr ? backend->AllocInts(n) : nullptr;
  }
  void Host(std::vector<float>* v, size_t n) {
    bytes += n * sizeof(float);
    if (backend != nullptr) v->resize(n);
  }
};

namespace {

std::vector<float> AlibiSlopesPow2(int n) {
  std::vector<float> s(n);
  double start = std::pow(2.0, -std::pow(2.0, -(std::log2(n) - 3)));
  for (int i = 0; i < n; ++i) s[i] = static_cast<float>(std::pow(start, i + 1));
  return s;
}

}  // namespace

std::vector<float> AlibiSlopes(int heads) {
  int closest = 1;
  while (closest * 2 <= heads) closest *= 2;
  std::vector<float> slopes = AlibiSlopesPow2(closest);
  if (closest != heads) {
    std::vector<float> extra = AlibiSlopesPow2(2 * closest);
    for (int i = 0; static_cast<int>(slopes.size()) < heads; i += 2) slopes.push_back(extra[i]);
  }
  return slopes;
}

std::vector<ParamInfo> GptModel::ParamLayout(const GptSpec& spec) {
  const int64_t C = spec.hidden, F = spec.ffn_hidden, Vp = spec.padded_vocab;
  std::vector<ParamInfo> params;
  size_t offset = 0;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, bool decay) {
    ParamInfo p;
    p.name = name;
    p.shape = std::move(shape);
    p.numel = 1;
    for (int64_t d : p.shape) p.numel *= static_cast<size_t>(d);
    p.offset = offset;
    p.weight_decay = decay;
    offset += p.numel;
    params.push_back(std::move(p));
  };
  add("embedding.word_embeddings.weight", {Vp, C}, true);
  if (!spec.alibi) add("embedding.position_embeddings.weight", {spec.max_positions, C}, true);
  if (spec.embed_layernorm) {
    add("embedding.layernorm.weight", {C}, false);
    add("embedding.layernorm.bias", {C}, false);
  }
  for (int l = 0; l < spec.num_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {C}, false);
    add(p + "input_layernorm.bias", {C}, false);
    add(p + "attention.query_key_value.weight", {3 * C, C}, true);
    add(p + "attention.query_key_value.bias", {3 * C}, false);
    if (spec.qk_layernorm) {
      const int64_t hs = C / spec.heads;
      add(p + "attention.q_layernorm.weight", {hs}, false);
      add(p + "attention.q_layernorm.bias", {hs}, false);
      add(p + "attention.k_layernorm.weight", {hs}, false);
      add(p + "attention.k_layernorm.bias", {hs}, false);
    }
    add(p + "attention.dense.weight", {C, C}, true);
    add(p + "attention.dense.bias", {C}, false);
    add(p + "post_attention_layernorm.weight", {C}, false);
    add(p + "post_attention_layernorm.bias", {C}, false);
    add(p + "mlp.dense_h_to_4h.weight", {F, C}, true);
    add(p + "mlp.dense_h_to_4h.bias", {F}, false);
    add(p + "mlp.dense_4h_to_h.weight", {C, F}, true);
    add(p + "mlp.dense_4h_to_h.bias", {C}, false);
  }
  add("final_layernorm.weight", {C}, false);
  add("final_layernorm.bias", {C}, false);
  return params;
}

GptModel::GptModel(Backend* backend, const GptSpec& spec)
    : backend_(backend), spec_(spec), params_(ParamLayout(spec)) {
  KEEL_CHECK(spec.hidden % spec.heads == 0, "hidden size must divide by heads");
  KEEL_CHECK(spec.padded_vocab >= spec.vocab, "padded vocab smaller than vocab");
  for (const ParamInfo& p : params_) num_params_ += p.numel;
  params_mem_ = backend_->AllocFloats(num_params_);
  grads_mem_ = backend_->AllocFloats(num_params_);
  if (spec.alibi) {
    std::vector<float> slopes = AlibiSlopes(spec.heads);
    alibi_slopes_ = backend_->AllocFloats(slopes.size());
    backend_->CopyToDevice(alibi_slopes_, slopes.data(), slopes.size());
  }
}

GptModel::~GptModel() {
  FreeActivations();
  if (lowp_params_) backend_->Free(lowp_params_);
  backend_->Free(params_mem_);
  backend_->Free(grads_mem_);
  if (alibi_slopes_) backend_->Free(alibi_slopes_);
}

NonFiniteParams FindNonFiniteParams(GptModel& model) {
  NonFiniteParams r;
  Backend* be = model.backend();
  r.count = be->CountNonFinite(model.param_data(), model.num_params());
  if (r.count == 0) return r;
  for (const ParamInfo& p : model.params()) {
    const size_t n = be->CountNonFinite(model.param_data() + p.offset, p.numel);
    if (n > 0) {
      r.first_tensor = p.name;
      r.in_first_tensor = n;
      break;
    }
  }
  return r;
}

const ParamInfo* GptModel::FindParam(const std::string& name) const {
  for (const ParamInfo& p : params_)
    if (p.name == name) return &p;
  return nullptr;
}

int64_t GptModel::FormulaParamCount(const GptSpec& s) {
  const int64_t n = s.num_layers, h = s.hidden, v = s.padded_vocab, sq = s.max_positions;
  return n * (12 * h * h + 13 * h) + v * h + sq * h + 2 * h;
}

void GptModel::Initialize(uint64_t seed, float std) {
  lowp_stale_ = true;
  const float proj_std = std / std::sqrt(2.0f * static_cast<float>(spec_.num_layers));
  std::vector<float> host;
  for (size_t pi = 0; pi < params_.size(); ++pi) {
    const ParamInfo& p = params_[pi];
    host.assign(p.numel, 0.0f);
    const bool is_norm = p.name.find("layernorm") != std::string::npos;
    const bool is_bias = p.name.size() >= 4 && p.name.compare(p.name.size() - 4, 4, "bias") == 0;
    if (is_norm && !is_bias) {
      host.assign(p.numel, 1.0f);
    } else if (!is_bias) {
      const bool is_proj = p.name.find("attention.dense.weight") != std::string::npos ||
                           p.name.find("dense_4h_to_h.weight") != std::string::npos;
      const float s = is_proj ? proj_std : std;
      const RngKey key{seed, RngPurpose::kInit, pi};
#pragma omp parallel for schedule(static)
      for (size_t i = 0; i < p.numel; ++i) host[i] = s * NormalAt(key, i);
    }
    backend_->CopyToDevice(params_mem_ + p.offset, host.data(), p.numel);
  }
}

// The one list of a micro-batch's buffers: the forward's activations that the backward reads, and
// the gradient scratch; the buffers outside the layers, then `layers` layers' own.
void GptModel::LayoutActivations(const GptSpec& spec, int B, int T, int layers, Activations* acts,
                                 BufferSource* src) {
  const size_t N = static_cast<size_t>(B) * T, C = spec.hidden, F = spec.ffn_hidden;
  const size_t NH = spec.heads, Vp = spec.padded_vocab;
  Activations& a = *acts;
  a.emb = src->Floats(N * C);
  a.emb_mean = src->Floats(N);
  a.emb_rstd = src->Floats(N);
  a.res.push_back(src->Floats(N * C));
  for (int l = 0; l < layers; ++l) {
    Activations::Layer y;
    y.ln1 = src->Floats(N * C);
    y.ln1_mean = src->Floats(N);
    y.ln1_rstd = src->Floats(N);
    y.qkv = src->Floats(N * 3 * C);
    y.att = src->Floats(static_cast<size_t>(B) * NH * T * T);
    y.atty = src->Floats(N * C);
    y.res2 = src->Floats(N * C);
    y.ln2 = src->Floats(N * C);
    y.ln2_mean = src->Floats(N);
    y.ln2_rstd = src->Floats(N);
    y.fch = src->Floats(N * F);
    y.fch_gelu = src->Floats(N * F);
    y.max_logit = src->Floats(static_cast<size_t>(B) * NH);
    if (spec.qk_layernorm) {
      y.qkv_raw = src->Floats(N * 3 * C);
      y.qk_mean = src->Floats(2 * N * NH);
      y.qk_rstd = src->Floats(2 * N * NH);
    }
    a.layers.push_back(y);
    a.res.push_back(src->Floats(N * C));  // the layer's output
  }
  a.lnf = src->Floats(N * C);
  a.lnf_mean = src->Floats(N);
  a.lnf_rstd = src->Floats(N);
  a.logits = src->Floats(N * Vp);
  a.losses = src->Floats(N);
  a.logz = src->Floats(N);
  a.tokens = src->Ints(N);
  a.targets = src->Ints(N);
  a.positions = src->Ints(N);
  a.doc_start = src->Ints(N);
  a.dres_a = src->Floats(N * C);
  a.dres_b = src->Floats(N * C);
  a.dres2 = src->Floats(N * C);
  a.dln = src->Floats(N * C);
  a.dqkv = src->Floats(N * 3 * C);
  if (spec.qk_layernorm) a.dqkv_raw = src->Floats(N * 3 * C);
  a.datty = src->Floats(N * C);
  a.dfch = src->Floats(N * F);
  a.dgelu = src->Floats(N * F);
  a.demb = src->Floats(N * C);
  src->Host(&a.host_losses, N);
}

uint64_t GptModel::LowpInputElements(const GptSpec& spec, int B, int T) {
  const uint64_t N = static_cast<uint64_t>(B) * static_cast<uint64_t>(T);
  const uint64_t NC = N * static_cast<uint64_t>(spec.hidden);
  const uint64_t NF = N * static_cast<uint64_t>(spec.ffn_hidden);
  return static_cast<uint64_t>(spec.num_layers) * (3 * NC + NF) + NC;
}

uint64_t GptModel::ActivationBytes(const GptSpec& spec, int B, int T, Precision precision) {
  const uint64_t lowp =
      precision == Precision::kFp32 ? 0 : LowpInputElements(spec, B, T) * sizeof(uint16_t);
  // Every layer's buffers are alike: the layout of no layer and of one layer give the rest.
  auto bytes = [&](int layers) {
    Activations a;
    BufferSource count;
    LayoutActivations(spec, B, T, layers, &a, &count);
    return count.bytes;
  };
  const uint64_t outside = bytes(0);
  return outside + (bytes(1) - outside) * static_cast<uint64_t>(spec.num_layers) + lowp;
}

uint64_t GptModel::ParamCount(const GptSpec& spec) {
  auto count = [&](int layers) {
    GptSpec s = spec;
    s.num_layers = layers;
    uint64_t n = 0;
    for (const ParamInfo& p : ParamLayout(s)) n += p.numel;
    return n;
  };
  const uint64_t outside = count(0);
  return outside + (count(1) - outside) * static_cast<uint64_t>(spec.num_layers);
}

GptModel::UpdatableWeights GptModel::weights_for_update() {
  const bool current = lowp_params_ != nullptr && !lowp_stale_ &&
                       lowp_precision_ == backend_->precision() &&
                       backend_->precision() != Precision::kFp32;
  if (!current) return {param_data(), nullptr};
  return {params_mem_, lowp_params_};
}

void GptModel::PrepareLowPrecisionWeights() {
  const Precision p = backend_->precision();
  if (p == Precision::kFp32) {
    if (lowp_params_) backend_->Free(lowp_params_);
    lowp_params_ = nullptr;
    return;
  }
  if (lowp_params_ == nullptr) lowp_params_ = backend_->AllocHalves(num_params_);
  if (lowp_stale_ || lowp_precision_ != p) {
    backend_->ToLowPrecision(lowp_params_, params_mem_, num_params_);
    lowp_precision_ = p;
    lowp_stale_ = false;
  }
}

uint16_t* GptModel::LowpInputOf(int layer, LowpInput which) const {
  if (lowp_acts_ == nullptr) return nullptr;
  const size_t NC = static_cast<size_t>(cur_B_) * cur_T_ * spec_.hidden;
  const size_t NF = static_cast<size_t>(cur_B_) * cur_T_ * spec_.ffn_hidden;
  return lowp_acts_ + layer * (3 * NC + NF) + static_cast<size_t>(which) * NC;
}

uint16_t* GptModel::LowpLnfInput() const {
  return lowp_acts_ == nullptr ? nullptr : LowpInputOf(spec_.num_layers, kLn1);
}

void GptModel::AllocateActivations(int B, int T) {
  if (acts_ && B == cur_B_ && T == cur_T_) return;
  FreeActivations();
  KEEL_CHECK(T <= spec_.max_positions, "sequence longer than max positions");
  acts_ = new Activations();
  BufferSource alloc;
  alloc.backend = backend_;
  LayoutActivations(spec_, B, T, spec_.num_layers, acts_, &alloc);
  cur_B_ = B;
  cur_T_ = T;
}

void GptModel::FreeActivations() {
  if (!acts_) return;
  Activations& a = *acts_;
  Backend* be = backend_;
  for (float* p :
       {a.emb, a.emb_mean, a.emb_rstd, a.lnf, a.lnf_mean, a.lnf_rstd, a.logits, a.losses, a.logz,
        a.dres_a, a.dres_b, a.dres2, a.dln, a.dqkv, a.datty, a.dfch, a.dgelu, a.demb})
    be->Free(p);
  for (float* p : a.res) be->Free(p);
  for (auto& y : a.layers) {
    for (float* p : {y.ln1, y.ln1_mean, y.ln1_rstd, y.qkv, y.att, y.atty, y.res2, y.ln2, y.ln2_mean,
                     y.ln2_rstd, y.fch, y.fch_gelu, y.max_logit})
      be->Free(p);
    for (float* p : {y.qkv_raw, y.qk_mean, y.qk_rstd})
      if (p) be->Free(p);
  }
  if (a.dqkv_raw) be->Free(a.dqkv_raw);
  be->Free(a.tokens);
  be->Free(a.targets);
  be->Free(a.positions);
  be->Free(a.doc_start);
  delete acts_;
  acts_ = nullptr;
  if (lowp_acts_ != nullptr) be->Free(lowp_acts_);
  lowp_acts_ = nullptr;
}

double GptModel::Forward(const int32_t* tokens, const int32_t* targets, int B, int T, float dloss) {
  AllocateActivations(B, T);
  PrepareLowPrecisionWeights();
  Activations& a = *acts_;
  Backend* be = backend_;
  const int C = spec_.hidden, F = spec_.ffn_hidden, NH = spec_.heads;
  const int N = B * T, V = spec_.vocab, Vp = spec_.padded_vocab;
  const size_t NC = static_cast<size_t>(N) * C, NF = static_cast<size_t>(N) * F;
  if (lowp_params_ == nullptr) {
    if (lowp_acts_ != nullptr) be->Free(lowp_acts_);
    lowp_acts_ = nullptr;
  } else if (lowp_acts_ == nullptr) {
    lowp_acts_ = be->AllocHalves(LowpInputElements(spec_, B, T));
  }
  // A matmul input in the products' 16-bit format, kept for the backward (nullptr in fp32).
  auto lowp_input = [&](uint16_t* dst, const float* x, size_t n) -> const uint16_t* {
    if (dst != nullptr) be->ToLowPrecision(dst, x, n);
    return dst;
  };
  float* P = params_mem_;
  size_t pi = 0;  // walks params_ in registration order
  auto next = [&]() { return P + params_[pi++].offset; };

  be->CopyIntsToDevice(a.tokens, tokens, N);
  // Packed documents: token t of a sequence belongs to the document that starts after the last
  // EOD before t (an EOD closes its own document); its position counts from that start.
  const int32_t* positions = nullptr;
  doc_start_ = nullptr;
  if (spec_.reset_position_ids || spec_.reset_attention_mask) {
    std::vector<int32_t> pos(static_cast<size_t>(N)), start(static_cast<size_t>(N));
    for (int b = 0; b < B; ++b) {
      int s = 0;
      for (int t = 0; t < T; ++t) {
        start[b * T + t] = s;
        pos[b * T + t] = t - s;
        if (tokens[b * T + t] == spec_.eod_id) s = t + 1;
      }
    }
    be->CopyIntsToDevice(a.positions, pos.data(), N);
    be->CopyIntsToDevice(a.doc_start, start.data(), N);
    if (spec_.reset_position_ids) positions = a.positions;
    if (spec_.reset_attention_mask) doc_start_ = a.doc_start;
  }
  positions_ = positions;
  const float* wte = next();
  const float* wpe = spec_.alibi ? nullptr : next();
  if (spec_.embed_layernorm) {
    be->EmbeddingForward(a.emb, a.tokens, wte, wpe, B, T, C, spec_.padded_vocab, positions);
    be->RoundToStorage(a.emb, NC);
    const float* w = next();
    const float* b = next();
    be->LayerNormForward(a.res[0], a.emb_mean, a.emb_rstd, a.emb, w, b, N, C, spec_.layernorm_eps);
  } else {
    be->EmbeddingForward(a.res[0], a.tokens, wte, wpe, B, T, C, spec_.padded_vocab, positions);
  }
  // fp16 (a no-op otherwise): every activation below is stored in fp16, as on an fp16 GPU run.
  be->RoundToStorage(a.res[0], NC);
  for (int l = 0; l < spec_.num_layers; ++l) {
    Activations::Layer& y = a.layers[l];
    const float *ln1w = next(), *ln1b = next(), *qkvw = next(), *qkvb = next();
    const float *qlnw = nullptr, *qlnb = nullptr, *klnw = nullptr, *klnb = nullptr;
    if (spec_.qk_layernorm) qlnw = next(), qlnb = next(), klnw = next(), klnb = next();
    const float *projw = next(), *projb = next(), *ln2w = next(), *ln2b = next();
    const float *fcw = next(), *fcb = next(), *fcpw = next(), *fcpb = next();
    float* x = a.res[l];
    be->LayerNormForward(y.ln1, y.ln1_mean, y.ln1_rstd, x, ln1w, ln1b, N, C, spec_.layernorm_eps);
    be->RoundToStorage(y.ln1, NC);
    const uint16_t* ln1_lowp = lowp_input(LowpInputOf(l, kLn1), y.ln1, NC);
    if (spec_.qk_layernorm) {
      be->MatmulForward(y.qkv_raw, y.ln1, qkvw, qkvb, N, C, 3 * C, Lowp(qkvw), ln1_lowp);
      be->QkLayerNormForward(y.qkv, y.qk_mean, y.qk_rstd, y.qkv_raw, qlnw, qlnb, klnw, klnb, N, C,
                             NH, spec_.layernorm_eps);
      be->RoundToStorage(y.qkv, 3 * NC);
    } else {
      be->MatmulForward(y.qkv, y.ln1, qkvw, qkvb, N, C, 3 * C, Lowp(qkvw), ln1_lowp);
    }
    be->AttentionForward(y.atty, y.att, y.qkv, alibi_slopes_, B, T, C, NH, y.max_logit, doc_start_);
    const uint16_t* atty_lowp = lowp_input(LowpInputOf(l, kAtty), y.atty, NC);
    // res2 = attn proj + x
    be->MatmulForward(y.res2, y.atty, projw, projb, N, C, C, Lowp(projw), atty_lowp);
    be->Add(y.res2, y.res2, x, NC);
    be->RoundToStorage(y.res2, NC);
    be->LayerNormForward(y.ln2, y.ln2_mean, y.ln2_rstd, y.res2, ln2w, ln2b, N, C,
                         spec_.layernorm_eps);
    be->RoundToStorage(y.ln2, NC);
    be->MatmulForward(y.fch, y.ln2, fcw, fcb, N, C, F, Lowp(fcw),
                      lowp_input(LowpInputOf(l, kLn2), y.ln2, NC));
    be->GeluForward(y.fch_gelu, y.fch, NF);
    be->RoundToStorage(y.fch_gelu, NF);
    be->MatmulForward(a.res[l + 1], y.fch_gelu, fcpw, fcpb, N, F, C, Lowp(fcpw),
                      lowp_input(LowpInputOf(l, kFchGelu), y.fch_gelu, NF));
    be->Add(a.res[l + 1], a.res[l + 1], y.res2, NC);
    be->RoundToStorage(a.res[l + 1], NC);
  }
  const float *lnfw = next(), *lnfb = next();
  be->LayerNormForward(a.lnf, a.lnf_mean, a.lnf_rstd, a.res[spec_.num_layers], lnfw, lnfb, N, C,
                       spec_.layernorm_eps);
  be->RoundToStorage(a.lnf, NC);
  // Tied output embedding. The logits are the products' output (fp16 in fp16); the cross-entropy
  // reads them in fp32.
  be->MatmulForward(a.logits, a.lnf, wte, nullptr, N, C, Vp, Lowp(wte),
                    lowp_input(LowpLnfInput(), a.lnf, NC));
  has_targets_ = targets != nullptr;
  if (!has_targets_) return 0.0;
  be->CopyIntsToDevice(a.targets, targets, N);
  be->CrossEntropyForwardBackward(a.losses, a.logz, a.logits, a.targets, N, V, Vp, dloss,
                                  spec_.z_loss);
  be->CopyToHost(a.host_losses.data(), a.losses, N);
  double sum = 0.0;
  for (float v : a.host_losses) sum += v;
  return sum / N;
}

void GptModel::Backward() {
  KEEL_CHECK(acts_ && has_targets_, "Backward needs a Forward with targets");
  Activations& a = *acts_;
  Backend* be = backend_;
  const int B = cur_B_, T = cur_T_;
  const int C = spec_.hidden, F = spec_.ffn_hidden, NH = spec_.heads;
  const int N = B * T, Vp = spec_.padded_vocab;
  const size_t NC = static_cast<size_t>(N) * C, NF = static_cast<size_t>(N) * F;
  float *P = params_mem_, *G = grads_mem_;
  // The step's first Backward writes the gradients: the matmuls overwrite theirs (weights and
  // biases); every other gradient is zeroed as the walk reaches it, before anything adds to it.
  const bool overwrite = overwrite_grads_;
  overwrite_grads_ = false;
  const bool add = !overwrite;
  // Walk the parameters backwards through the same registration order as Forward.
  size_t pi = params_.size();
  auto prev = [&](float** grad, bool written_by_matmul = false) {
    --pi;
    *grad = G + params_[pi].offset;
    if (overwrite && !written_by_matmul) be->Zero(*grad, params_[pi].numel);
    return P + params_[pi].offset;
  };
  constexpr bool kMatmul = true;

  float *dlnfb, *dlnfw;
  prev(&dlnfb);
  const float* lnfw = prev(&dlnfw);
  float* dwte = G + params_[0].offset;
  const float* wte = P + params_[0].offset;

  // logits = lnf wte^T: the cross-entropy left dlogits in a.logits.
  float* dres = a.dres_a;     // gradient w.r.t. the current residual stream
  float* dres_in = a.dres_b;  // gradient w.r.t. the previous one
  be->Zero(a.dln, NC);
  // The tied embedding's gradient: the output layer's product writes it first, the embedding
  // backward (last) adds to it.
  be->MatmulBackward(a.dln, dwte, nullptr, a.logits, a.lnf, wte, N, C, Vp, Lowp(wte), add,
                     LowpLnfInput());
  be->Zero(dres, NC);
  be->LayerNormBackward(dres, dlnfw, dlnfb, a.dln, a.res[spec_.num_layers], lnfw, a.lnf_mean,
                        a.lnf_rstd, N, C);
  // fp16 (a no-op otherwise): activation gradients are stored in fp16 too; the matmuls and
  // attention round their own outputs.
  be->RoundToStorage(dres, NC);

  for (int l = spec_.num_layers - 1; l >= 0; --l) {
    Activations::Layer& y = a.layers[l];
    float *dfcpb, *dfcpw, *dfcb, *dfcw, *dln2b, *dln2w, *dprojb, *dprojw, *dqkvb, *dqkvw, *dln1b,
        *dln1w;
    prev(&dfcpb, kMatmul);
    const float* fcpw = prev(&dfcpw, kMatmul);
    prev(&dfcb, kMatmul);
    const float* fcw = prev(&dfcw, kMatmul);
    prev(&dln2b);
    const float* ln2w = prev(&dln2w);
    prev(&dprojb, kMatmul);
    const float* projw = prev(&dprojw, kMatmul);
    float *dklnb = nullptr, *dklnw = nullptr, *dqlnb = nullptr, *dqlnw = nullptr;
    const float *klnw = nullptr, *qlnw = nullptr;
    if (spec_.qk_layernorm) {
      prev(&dklnb);
      klnw = prev(&dklnw);
      prev(&dqlnb);
      qlnw = prev(&dqlnw);
    }
    prev(&dqkvb, kMatmul);
    const float* qkvw = prev(&dqkvw, kMatmul);
    prev(&dln1b);
    const float* ln1w = prev(&dln1w);

    // res[l+1] = res2 + fcproj(gelu(fc(ln2(res2))))
    be->Copy(a.dres2, dres, NC);  // skip connection
    be->Zero(a.dgelu, NF);
    be->MatmulBackward(a.dgelu, dfcpw, dfcpb, dres, y.fch_gelu, fcpw, N, F, C, Lowp(fcpw), add,
                       LowpInputOf(l, kFchGelu));
    be->Zero(a.dfch, NF);
    be->GeluBackward(a.dfch, y.fch, a.dgelu, NF);
    be->RoundToStorage(a.dfch, NF);
    be->Zero(a.dln, NC);
    be->MatmulBackward(a.dln, dfcw, dfcb, a.dfch, y.ln2, fcw, N, C, F, Lowp(fcw), add,
                       LowpInputOf(l, kLn2));
    be->LayerNormBackward(a.dres2, dln2w, dln2b, a.dln, y.res2, ln2w, y.ln2_mean, y.ln2_rstd, N, C);
    be->RoundToStorage(a.dres2, NC);
    // res2 = x + proj(attn(qkv(ln1(x))))
    be->Copy(dres_in, a.dres2, NC);  // skip connection
    be->Zero(a.datty, NC);
    be->MatmulBackward(a.datty, dprojw, dprojb, a.dres2, y.atty, projw, N, C, C, Lowp(projw), add,
                       LowpInputOf(l, kAtty));
    be->Zero(a.dqkv, NC * 3);
    be->AttentionBackward(a.dqkv, a.datty, y.qkv, y.att, B, T, C, NH);
    float* dqkv_mm = a.dqkv;  // gradient w.r.t. the matmul's output
    if (spec_.qk_layernorm) {
      be->Zero(a.dqkv_raw, NC * 3);
      be->QkLayerNormBackward(a.dqkv_raw, dqlnw, dqlnb, dklnw, dklnb, a.dqkv, y.qkv_raw, qlnw, klnw,
                              y.qk_mean, y.qk_rstd, N, C, NH);
      be->RoundToStorage(a.dqkv_raw, NC * 3);
      dqkv_mm = a.dqkv_raw;
    }
    be->Zero(a.dln, NC);
    be->MatmulBackward(a.dln, dqkvw, dqkvb, dqkv_mm, y.ln1, qkvw, N, C, 3 * C, Lowp(qkvw), add,
                       LowpInputOf(l, kLn1));
    be->LayerNormBackward(dres_in, dln1w, dln1b, a.dln, a.res[l], ln1w, y.ln1_mean, y.ln1_rstd, N,
                          C);
    be->RoundToStorage(dres_in, NC);
    std::swap(dres, dres_in);
    // Layer l and everything after it in the buffer (later layers, the final LayerNorm) are final.
    if (grad_ready_) grad_ready_(params_[pi].offset);
  }
  // dres now holds the gradient w.r.t. res[0].
  float* dwpe = nullptr;
  const float* demb = dres;
  if (spec_.embed_layernorm) {
    float *delnb, *delnw;
    prev(&delnb);
    const float* elnw = prev(&delnw);
    be->Zero(a.demb, NC);
    be->LayerNormBackward(a.demb, delnw, delnb, dres, a.emb, elnw, a.emb_mean, a.emb_rstd, N, C);
    be->RoundToStorage(a.demb, NC);
    demb = a.demb;
  }
  if (!spec_.alibi) prev(&dwpe);
  be->EmbeddingBackward(dwte, dwpe, demb, a.tokens, B, T, C, spec_.padded_vocab, positions_);
}

void GptModel::ZeroGrad() {
  backend_->Zero(grads_mem_, num_params_);
}

std::vector<float> GptModel::LogitsAt(int b, int t) {
  KEEL_CHECK(acts_ && b < cur_B_ && t < cur_T_, "LogitsAt out of range");
  KEEL_CHECK(!has_targets_, "LogitsAt needs a Forward without targets (logits are gradients)");
  std::vector<float> row(spec_.vocab);
  const size_t off = (static_cast<size_t>(b) * cur_T_ + t) * spec_.padded_vocab;
  backend_->CopyToHost(row.data(), acts_->logits + off, spec_.vocab);
  return row;
}

double GptModel::LastZLoss() {
  KEEL_CHECK(acts_ && has_targets_, "LastZLoss needs a Forward with targets");
  if (spec_.z_loss == 0.0f) return 0.0;
  const int N = cur_B_ * cur_T_;
  std::vector<float> h(N);
  backend_->CopyToHost(h.data(), acts_->logz, N);
  double s = 0.0;
  for (float v : h) s += double(v) * v;
  return spec_.z_loss * s / N;
}

double GptModel::LastMaxAttentionLogit() {
  KEEL_CHECK(acts_ != nullptr, "LastMaxAttentionLogit needs a Forward");
  const size_t n = static_cast<size_t>(cur_B_) * spec_.heads;
  std::vector<float> h(n);
  double mx = -INFINITY;
  for (const auto& y : acts_->layers) {
    backend_->CopyToHost(h.data(), y.max_logit, n);
    for (float v : h) mx = std::max(mx, double(v));
  }
  return mx;
}

double GptModel::SequenceLoss(int b) const {
  KEEL_CHECK(acts_ && has_targets_ && b >= 0 && b < cur_B_,
             "SequenceLoss needs a Forward with targets");
  const float* row = acts_->host_losses.data() + static_cast<size_t>(b) * cur_T_;
  double s = 0.0;
  for (int t = 0; t < cur_T_; ++t) s += row[t];
  return s / cur_T_;
}

double GptModel::MeanLogZ() {
  KEEL_CHECK(acts_ && has_targets_, "MeanLogZ needs a Forward with targets");
  const int N = cur_B_ * cur_T_;
  std::vector<float> h(N);
  backend_->CopyToHost(h.data(), acts_->logz, N);
  double s = 0.0;
  for (float v : h) s += v;
  return s / N;
}

GptSpec SpecFromConfig(const TrainConfig& cfg) {
  GptSpec s;
  s.num_layers = cfg.num_layers;
  s.hidden = cfg.hidden_size;
  s.ffn_hidden = cfg.ffn_hidden_size;
  s.heads = cfg.num_attention_heads;
  s.max_positions = cfg.max_position_embeddings;
  s.vocab = cfg.vocab_size;
  s.padded_vocab = cfg.padded_vocab_size;
  s.alibi = cfg.position_embedding_type == PositionEmbedding::kAlibi;
  s.embed_layernorm = cfg.embed_layernorm;
  s.layernorm_eps = cfg.layernorm_epsilon;
  s.qk_layernorm = cfg.qk_layernorm;
  s.z_loss = static_cast<float>(cfg.z_loss);
  s.reset_position_ids = cfg.reset_position_ids;
  s.reset_attention_mask = cfg.reset_attention_mask;
  s.eod_id = cfg.eod_id;
  return s;
}

}  // namespace keel

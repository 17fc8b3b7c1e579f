#include "model/gpt.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numbers>

#include "comm/communicator.h"
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
  std::vector<Layer> layers;  // under recomputation the layers share buffers (see Layout...)
  Recompute recompute = Recompute::kNone;
  int full_layers = 0;  // layers 1..full_layers-1 use layer 0's buffers
  float *lnf = nullptr, *lnf_mean = nullptr, *lnf_rstd = nullptr, *logits = nullptr,
        *losses = nullptr, *logz = nullptr;
  // Tensor parallel: the cross-entropy's row maximum (N) and sums (2,N) over the group.
  float *row_max = nullptr, *ce_sums = nullptr;
  // Sequence parallel: a norm's output rows before the gather (rows,C), and the whole rows (N,C)
  // of a row-parallel output before its reduce-scatter or of a gradient gathered for a product.
  float *chunk = nullptr, *gathered = nullptr;
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

// Visits, for rank `rank` of `tensor`, each contiguous run of p's slice: f(offset in the whole
// tensor, offset in the slice, length), in elements (model/tensor_split.h's layout).
template <typename F>
void ForEachSliceRun(const ParamInfo& p, int rank, int tensor, F f) {
  const int d = p.split.dim;
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < d; ++i) outer *= p.full_shape[i];
  for (size_t i = d + 1; i < p.full_shape.size(); ++i) inner *= p.full_shape[i];
  const int64_t extent = p.full_shape[d], local = extent / tensor;
  for (int64_t o = 0; o < outer; ++o) {
    int64_t start = 0, at = 0;
    for (int64_t part : p.split.parts) {
      const int64_t len = part / tensor;
      f((o * extent + start + rank * len) * inner, (o * local + at) * inner, len * inner);
      start += part;
      at += len;
    }
  }
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

std::string ModelStage::Describe(int num_layers) const {
  const int last = last_layer < 0 ? num_layers : last_layer;
  std::string s = embedding ? "embedding + " : "";
  // One layer reads "layer 4", as the partition note says it.
  s += last - first_layer == 1 ? fmt::format("layer {}", first_layer)
                               : fmt::format("layers {}-{}", first_layer, last - 1);
  if (head) s += " + head";
  return s;
}

std::vector<ParamInfo> GptModel::ParamLayout(const GptSpec& spec, int tensor,
                                             const ModelStage& stage) {
  const int first = stage.first_layer;
  const int last = stage.last_layer < 0 ? spec.num_layers : stage.last_layer;
  const int64_t C = spec.hidden, F = spec.ffn_hidden, Vp = spec.padded_vocab;
  const int64_t W = spec.QkvWidth(), F1 = spec.Fc1Width();
  std::vector<ParamInfo> params;
  size_t offset = 0;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, bool decay) {
    ParamInfo p;
    p.name = name;
    p.split = TensorSplitOf(spec, name, shape);
    p.shape = ShardShape(p.split, shape, tensor);
    p.full_shape = std::move(shape);
    p.numel = 1;
    for (int64_t d : p.shape) p.numel *= static_cast<size_t>(d);
    p.offset = offset;
    p.weight_decay = decay;
    offset += p.numel;
    params.push_back(std::move(p));
  };
  // A norm's weight, and its bias unless it is an RMSNorm.
  auto norm = [&](const std::string& name) {
    add(name + ".weight", {C}, false);
    if (!spec.rmsnorm) add(name + ".bias", {C}, false);
  };
  // A linear layer's weight, and its bias unless biases are off.
  auto linear = [&](const std::string& name, int64_t out, int64_t in) {
    add(name + ".weight", {out, in}, true);
    if (spec.bias) add(name + ".bias", {out}, false);
  };
  if (stage.embedding) {
    add("embedding.word_embeddings.weight", {Vp, C}, true);
    if (spec.LearnedPositions())
      add("embedding.position_embeddings.weight", {spec.max_positions, C}, true);
    if (spec.embed_layernorm) norm("embedding.layernorm");
  }
  for (int l = first; l < last; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    norm(p + "input_layernorm");
    linear(p + "attention.query_key_value", W, C);
    if (spec.qk_layernorm) {
      const int64_t hs = spec.HeadDim();
      add(p + "attention.q_layernorm.weight", {hs}, false);
      add(p + "attention.q_layernorm.bias", {hs}, false);
      add(p + "attention.k_layernorm.weight", {hs}, false);
      add(p + "attention.k_layernorm.bias", {hs}, false);
    }
    linear(p + "attention.dense", C, C);
    norm(p + "post_attention_layernorm");
    linear(p + "mlp.dense_h_to_4h", F1, C);
    linear(p + "mlp.dense_4h_to_h", C, F);
  }
  if (!stage.head) return params;
  norm("final_layernorm");
  if (spec.untie_embeddings) {
    add("output_layer.weight", {Vp, C}, true);
  } else if (!stage.embedding) {
    // The tied output layer on a last stage without the embedding: its own copy (Megatron's).
    add("embedding.word_embeddings.weight", {Vp, C}, true);
    params.back().tied_copy = true;
  }
  return params;
}

std::vector<double> RopeFrequencies(const GptSpec& spec) {
  const int rot = spec.RotaryDim();
  std::vector<double> w(rot / 2);
  for (int i = 0; i < rot / 2; ++i) {
    w[i] = std::pow(spec.rotary_base, -2.0 * i / rot) / spec.RopeLinearFactor();
    if (!spec.RopeLlama3()) continue;
    const double wavelength = 2 * std::numbers::pi / w[i];
    const double original = spec.rope_original_max_positions;
    if (wavelength < original / spec.rope_high_freq_factor) continue;  // fast: kept
    if (wavelength > original / spec.rope_low_freq_factor) {           // slow: stretched
      w[i] /= spec.rope_llama3_factor;
      continue;
    }
    const double s = (original / wavelength - spec.rope_low_freq_factor) /
                     (spec.rope_high_freq_factor - spec.rope_low_freq_factor);
    w[i] = (1 - s) * w[i] / spec.rope_llama3_factor + s * w[i];
  }
  return w;
}

std::string DescribeRope(const GptSpec& spec) {
  std::string scaling;
  if (spec.RopeLlama3())
    scaling = fmt::format(", Llama 3 scaling x{} of {} positions, bands {}-{}",
                          spec.rope_llama3_factor, spec.rope_original_max_positions,
                          spec.rope_low_freq_factor, spec.rope_high_freq_factor);
  if (spec.RopeLinearFactor() != 1)
    scaling += fmt::format(", positions / {}", spec.RopeLinearFactor());
  return fmt::format("RoPE (base {}, {} of {} dims{})", spec.rotary_base, spec.RotaryDim(),
                     spec.HeadDim(), scaling);
}

std::vector<float> RopeCosSin(const GptSpec& spec) {
  const int rot = spec.RotaryDim(), half = rot / 2;
  const std::vector<double> w = RopeFrequencies(spec);
  std::vector<float> table(static_cast<size_t>(spec.max_positions) * rot);
  for (int p = 0; p < spec.max_positions; ++p) {
    for (int i = 0; i < half; ++i) {
      // In double: the angle keeps its precision at long positions.
      const double angle = p * w[i];
      table[static_cast<size_t>(p) * rot + i] = static_cast<float>(std::cos(angle));
      table[static_cast<size_t>(p) * rot + half + i] = static_cast<float>(std::sin(angle));
    }
  }
  return table;
}

Status GptModel::CheckTensorParallel(const GptSpec& spec, int tensor) {
  if (tensor < 1) return Status::InvalidArgument(fmt::format("tensor size {} < 1", tensor));
  struct Divides {
    int64_t n;
    const char* what;
  };
  for (const Divides& d : {Divides{spec.heads, "attention heads"},
                           Divides{spec.KvHeads(), "key/value heads (query groups)"},
                           Divides{spec.ffn_hidden, "FFN hidden size"},
                           Divides{spec.padded_vocab, "padded vocabulary"}}) {
    if (d.n % tensor != 0)
      return Status::InvalidArgument(
          fmt::format("tensor-parallel size {} does not divide the {} ({}): choose a tensor "
                      "size that divides it",
                      tensor, d.what, d.n));
  }
  return Status::OK();
}

GptModel::Dims GptModel::DimsOf(const GptSpec& spec, int tensor, bool sp) {
  Dims d;
  d.tensor = tensor;
  d.sp = sp && tensor > 1;
  d.C = spec.hidden;
  d.hs = spec.HeadDim();
  d.NH = spec.heads / tensor;
  d.G = spec.KvHeads() / tensor;
  d.A = d.NH * d.hs;
  d.W = (d.NH + 2 * d.G) * d.hs;
  d.F = spec.ffn_hidden / tensor;
  d.F1 = spec.Fc1Width() / tensor;
  d.Vp = spec.padded_vocab / tensor;
  return d;
}

GptModel::GptModel(Backend* backend, const GptSpec& spec, TensorParallel tp, ModelStage stage)
    : GptModel(backend, spec, tp, stage, Storage{}) {}

GptModel::GptModel(Backend* backend, const GptSpec& spec, TensorParallel tp, ModelStage stage,
                   Storage storage)
    : backend_(backend), spec_(spec), stage_(stage) {
  if (stage_.last_layer < 0) stage_.last_layer = spec.num_layers;
  KEEL_CHECK(stage_.first_layer >= 0 && stage_.first_layer <= stage_.last_layer &&
                 stage_.last_layer <= spec.num_layers,
             fmt::format("pipeline stage {} outside the model's {} layers",
                         stage_.Describe(spec.num_layers), spec.num_layers));
  KEEL_CHECK(stage_.embedding == (stage_.first_layer == 0) &&
                 stage_.head == (stage_.last_layer == spec.num_layers),
             fmt::format("pipeline stage {}: the embedding goes with layer 0 and the head with "
                         "the last layer",
                         stage_.Describe(spec.num_layers)));
  nl_ = stage_.last_layer - stage_.first_layer;
  KEEL_CHECK(spec.hidden % spec.heads == 0, "hidden size must divide by heads");
  KEEL_CHECK(spec.KvHeads() >= 1 && spec.heads % spec.KvHeads() == 0,
             "key/value heads must divide the heads");
  KEEL_CHECK(!spec.rope || spec.RotaryDim() >= 2, "RoPE needs at least 2 rotary dimensions");
  KEEL_CHECK(spec.padded_vocab >= spec.vocab, "padded vocab smaller than vocab");
  if (tp.group != nullptr && tp.group->world_size() > 1) {
    tp_group_ = tp.group;
    tp_ = tp.group->world_size();
    tp_rank_ = tp.group->rank();
    sp_ = tp.sequence_parallel;
    const Status st = CheckTensorParallel(spec, tp_);
    if (!st.ok()) throw KeelError(st);
  }
  d_ = DimsOf(spec, tp_, sp_);
  vocab_start_ = tp_rank_ * d_.Vp;
  params_ = ParamLayout(spec, tp_, stage_);
  for (const ParamInfo& p : params_) num_params_ += p.numel;
  init_index_.resize(params_.size());
  if (whole_model()) {
    for (size_t i = 0; i < params_.size(); ++i) init_index_[i] = i;
  } else {
    // A stage's tensors keep their whole-model keys (the tied copy: the embedding's, index 0).
    const std::vector<ParamInfo> whole = ParamLayout(spec, tp_);
    for (size_t i = 0; i < params_.size(); ++i) {
      size_t j = 0;
      while (whole[j].name != params_[i].name) ++j;
      init_index_[i] = j;
    }
  }
  partial_offset_.assign(params_.size(), SIZE_MAX);
  for (size_t i = 0; i < params_.size() && tp_ > 1; ++i) {
    const std::string& name = params_[i].name;
    const bool qk_norm = name.find("attention.q_layernorm") != std::string::npos ||
                         name.find("attention.k_layernorm") != std::string::npos;
    if (qk_norm || (sp_ && name.find("layernorm") != std::string::npos)) {
      partial_offset_[i] = partial_numel_;
      partial_numel_ += params_[i].numel;
    }
  }
  if (partial_numel_ > 0) partial_grads_ = backend_->AllocFloats(partial_numel_);
  // Each layer's first tensor, and (entry num_layers) the first one after the layers.
  // Each (local) layer's first tensor, and (entry nl_) the first one after the layers.
  layer_first_param_.assign(nl_ + 1, params_.size());
  for (size_t i = params_.size(); i-- > 0;) {
    const std::string& name = params_[i].name;
    if (name.rfind("layers.", 0) == 0) {
      layer_first_param_[std::stoi(name.substr(7)) - stage_.first_layer] = i;
    } else if (i > 0 && params_[i - 1].name.rfind("layers.", 0) == 0) {
      layer_first_param_[nl_] = i;
    }
  }
  if (storage.params != nullptr) {
    params_mem_ = storage.params;
    grads_mem_ = storage.grads;
    owns_storage_ = false;
  } else {
    params_mem_ = backend_->AllocFloats(num_params_);
    grads_mem_ = backend_->AllocFloats(num_params_);
  }
  if (spec.alibi) {
    // A head's slope depends on its index among all heads: this rank's heads' slopes.
    const std::vector<float> all = AlibiSlopes(spec.heads);
    const std::vector<float> slopes(all.begin() + tp_rank_ * d_.NH,
                                    all.begin() + (tp_rank_ + 1) * d_.NH);
    alibi_slopes_ = backend_->AllocFloats(slopes.size());
    backend_->CopyToDevice(alibi_slopes_, slopes.data(), slopes.size());
  }
  if (spec.rope) {
    std::vector<float> table = RopeCosSin(spec);
    rope_cos_sin_ = backend_->AllocFloats(table.size());
    backend_->CopyToDevice(rope_cos_sin_, table.data(), table.size());
  }
}

std::unique_ptr<GptModel> GptModel::MakeChunked(Backend* backend, const GptSpec& spec,
                                                TensorParallel tp,
                                                const std::vector<ModelStage>& chunks) {
  KEEL_CHECK(!chunks.empty(), "a pipeline rank holds at least one model chunk");
  if (chunks.size() == 1) return std::make_unique<GptModel>(backend, spec, tp, chunks[0]);
  // The owner is built as chunk 0 (checked like any stage) and its buffers then laid out for all.
  std::unique_ptr<GptModel> m(new GptModel(backend, spec, tp, chunks[0], Storage{}));
  const int tensor = m->tp_;
  m->params_.clear();
  size_t total = 0;
  for (const ModelStage& c : chunks) {
    for (ParamInfo p : ParamLayout(spec, tensor, c)) {
      p.offset += total;
      m->params_.push_back(std::move(p));
    }
    total = m->params_.empty() ? 0 : m->params_.back().offset + m->params_.back().numel;
  }
  backend->Free(m->params_mem_);
  backend->Free(m->grads_mem_);
  m->num_params_ = total;
  m->params_mem_ = backend->AllocFloats(total);
  m->grads_mem_ = backend->AllocFloats(total);
  size_t at = 0;
  for (const ModelStage& c : chunks) {
    m->chunks_.emplace_back(
        new GptModel(backend, spec, tp, c, Storage{m->params_mem_ + at, m->grads_mem_ + at}));
    at += m->chunks_.back()->num_params();
  }
  // Described by its span, for messages (whole_model() is false: it has chunks).
  m->stage_.first_layer = chunks.front().first_layer;
  m->stage_.last_layer = chunks.back().last_layer < 0 ? spec.num_layers : chunks.back().last_layer;
  m->stage_.embedding = chunks.front().embedding;
  m->stage_.head = chunks.back().head;
  return m;
}

GptModel::~GptModel() {
  chunks_.clear();
  FreeAllActivations();
  if (lowp_params_) backend_->Free(lowp_params_);
  if (owns_storage_) {
    backend_->Free(params_mem_);
    backend_->Free(grads_mem_);
  }
  if (alibi_slopes_) backend_->Free(alibi_slopes_);
  if (rope_cos_sin_) backend_->Free(rope_cos_sin_);
  if (partial_grads_) backend_->Free(partial_grads_);
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

bool GptModel::IsGpt2Shape(const GptSpec& s) {
  return !s.alibi && !s.rope && !s.embed_layernorm && !s.rmsnorm && !s.swiglu &&
         s.KvHeads() == s.heads && !s.untie_embeddings && s.bias && !s.qk_layernorm &&
         s.ffn_hidden == 4 * s.hidden;
}

int64_t GptModel::FormulaParamCount(const GptSpec& s) {
  const int64_t n = s.num_layers, h = s.hidden, v = s.padded_vocab, sq = s.max_positions;
  return n * (12 * h * h + 13 * h) + v * h + sq * h + 2 * h;
}

void GptModel::Initialize(uint64_t seed, float std) {
  lowp_stale_ = true;
  for (auto& c : chunks_) c->Initialize(seed, std);
  if (!chunks_.empty()) return;
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
      const RngKey key{seed, RngPurpose::kInit, init_index_[pi]};
      if (p.split.replicated() || tp_ == 1) {
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < p.numel; ++i) host[i] = s * NormalAt(key, i);
      } else {
        // This rank's slice, each value drawn at its element index in the whole tensor.
        ForEachSliceRun(p, tp_rank_, tp_, [&](int64_t full, int64_t local, int64_t len) {
          for (int64_t k = 0; k < len; ++k) host[local + k] = s * NormalAt(key, full + k);
        });
      }
    }
    backend_->CopyToDevice(params_mem_ + p.offset, host.data(), p.numel);
  }
}

// The one list of a micro-batch's buffers: the forward's activations that the backward reads, and
// the gradient scratch; the buffers outside the layers, then `layers` layers' own.
// Tensor parallel: the products' outputs and attention have this rank's widths (Dims); under
// sequence parallelism the residual stream and the norms' statistics have N / T rows (R).
void GptModel::LayoutActivations(const GptSpec& spec, const Dims& d, int B, int T, int layers,
                                 bool head, Recompute recompute, int full_layers, Activations* acts,
                                 BufferSource* src) {
  const size_t N = static_cast<size_t>(B) * T, C = spec.hidden, F = d.F;
  const size_t NH = d.NH, Vp = d.Vp, A = d.A;
  const size_t W = d.W, F1 = d.F1;
  const size_t R = d.sp ? N / d.tensor : N;  // rows of the residual stream on this rank
  // RMSNorm keeps no mean.
  auto mean = [&]() { return spec.rmsnorm ? nullptr : src->Floats(R); };
  Activations& a = *acts;
  a.recompute = recompute;
  a.full_layers = full_layers;
  a.emb = src->Floats(R * C);
  a.emb_mean = mean();
  a.emb_rstd = src->Floats(R);
  a.res.push_back(src->Floats(R * C));
  for (int l = 0; l < layers; ++l) {
    Activations::Layer y;
    if (l > 0 && l < full_layers) {
      y = a.layers[0];  // the recomputed layers' activations in layer 0's buffers
    } else {
      y.ln1 = src->Floats(N * C);  // gathered whole under sequence parallelism
      y.ln1_mean = mean();
      y.ln1_rstd = src->Floats(R);
      y.qkv = src->Floats(N * W);
      if (l > 0 && recompute == Recompute::kSelective) {
        y.att = a.layers[0].att;  // one attention-probability buffer for all layers
      } else {
        y.att = src->Floats(static_cast<size_t>(B) * NH * T * T);
      }
      y.atty = src->Floats(N * A);
      y.res2 = src->Floats(R * C);
      y.ln2 = src->Floats(N * C);
      y.ln2_mean = mean();
      y.ln2_rstd = src->Floats(R);
      y.fch = src->Floats(N * F1);
      y.fch_gelu = src->Floats(N * F);
      if (spec.qk_layernorm) {
        y.qkv_raw = src->Floats(N * W);
        y.qk_mean = src->Floats(2 * N * NH);
        y.qk_rstd = src->Floats(2 * N * NH);
      }
    }
    y.max_logit = src->Floats(static_cast<size_t>(B) * NH);  // per layer: a guard signal
    a.layers.push_back(y);
    a.res.push_back(src->Floats(R * C));  // the layer's output
  }
  if (head) {
    a.lnf = src->Floats(N * C);
    a.lnf_mean = mean();
    a.lnf_rstd = src->Floats(R);
    a.logits = src->Floats(N * Vp);
    a.losses = src->Floats(N);
    a.logz = src->Floats(N);
  }
  if (d.tensor > 1 && head) {
    a.row_max = src->Floats(N);
    a.ce_sums = src->Floats(2 * N);
  }
  if (d.sp) {
    a.chunk = src->Floats(R * C);
    a.gathered = src->Floats(N * C);
  }
  a.tokens = src->Ints(N);
  a.targets = src->Ints(N);
  a.positions = src->Ints(N);
  a.doc_start = src->Ints(N);
  a.dres_a = src->Floats(R * C);
  a.dres_b = src->Floats(R * C);
  a.dres2 = src->Floats(R * C);
  a.dln = src->Floats(N * C);
  a.dqkv = src->Floats(N * W);
  if (spec.qk_layernorm) a.dqkv_raw = src->Floats(N * W);
  a.datty = src->Floats(N * A);
  a.dfch = src->Floats(N * F1);
  a.dgelu = src->Floats(N * F);
  a.demb = src->Floats(R * C);
  if (head) src->Host(&a.host_losses, N);
}

uint64_t GptModel::LowpInputElements(const GptSpec& spec, int layers, int B, int T,
                                     int full_layers) {
  const uint64_t N = static_cast<uint64_t>(B) * static_cast<uint64_t>(T);
  const uint64_t NC = N * static_cast<uint64_t>(spec.hidden);
  const uint64_t NF = N * static_cast<uint64_t>(spec.ffn_hidden);
  // Full recomputation rebuilds a layer's copies with its forward: the recomputed layers share
  // one layer's slots.
  const uint64_t slots = static_cast<uint64_t>(layers - std::max(full_layers - 1, 0));
  return slots * (3 * NC + NF) + NC;
}

int GptModel::FullRecomputeLayers(const GptSpec& spec, Recompute r, int full_layers) {
  if (r != Recompute::kFull) return 0;
  return full_layers < 0 ? spec.num_layers : std::min(full_layers, spec.num_layers);
}

uint64_t GptModel::ActivationBytes(const GptSpec& spec, int B, int T, Precision precision,
                                   Recompute recompute, int full_layers, int tensor,
                                   bool sequence_parallel, bool head) {
  const Dims dims = DimsOf(spec, tensor, sequence_parallel);
  const int full = FullRecomputeLayers(spec, recompute, full_layers);
  const uint64_t lowp =
      precision == Precision::kFp32
          ? 0
          : LowpInputElements(spec, spec.num_layers, B, T, full) * sizeof(uint16_t);
  // Layers after the first are of two kinds, recomputed (they add only what each keeps) or not:
  // the layouts of one and two layers give each kind's share.
  auto bytes = [&](int layers, int shared) {
    Activations a;
    BufferSource count;
    LayoutActivations(spec, dims, B, T, layers, head, recompute, shared, &a, &count);
    return count.bytes;
  };
  if (spec.num_layers <= 0) return bytes(0, 0) + lowp;
  const uint64_t one = bytes(1, 0);
  const uint64_t recomputed = bytes(2, 2) - one, kept = bytes(2, 0) - one;
  const int n_recomputed = std::max(full - 1, 0), n_kept = spec.num_layers - 1 - n_recomputed;
  return one + recomputed * static_cast<uint64_t>(n_recomputed) +
         kept * static_cast<uint64_t>(n_kept) + lowp;
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
  if (!current) return {mutable_param_data(), nullptr};
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
    ++lowp_conversions_;
  }
}

uint16_t* GptModel::LowpInputOf(int layer, LowpInput which) const {
  if (lowp_acts_ == nullptr) return nullptr;
  const size_t NC = static_cast<size_t>(cur_B_) * cur_T_ * spec_.hidden;
  const size_t NF = static_cast<size_t>(cur_B_) * cur_T_ * spec_.ffn_hidden;
  const size_t slot =
      layer < full_layers_ ? 0 : static_cast<size_t>(layer - std::max(full_layers_ - 1, 0));
  return lowp_acts_ + slot * (3 * NC + NF) + static_cast<size_t>(which) * NC;
}

uint16_t* GptModel::LowpLnfInput() const {
  if (lowp_acts_ == nullptr) return nullptr;
  const size_t NC = static_cast<size_t>(cur_B_) * cur_T_ * spec_.hidden;
  const size_t NF = static_cast<size_t>(cur_B_) * cur_T_ * spec_.ffn_hidden;
  const size_t slots = static_cast<size_t>(nl_ - std::max(full_layers_ - 1, 0));
  return lowp_acts_ + slots * (3 * NC + NF);
}

void GptModel::set_recompute(Recompute r, int full_layers) {
  for (auto& c : chunks_) c->set_recompute(r, full_layers);
  // A stage recomputes its own first `full_layers` layers (Megatron's count is per stage).
  GptSpec local = spec_;
  local.num_layers = nl_;
  const int full = FullRecomputeLayers(local, r, full_layers);
  if (r == recompute_ && full == full_layers_) return;
  FreeAllActivations();  // laid out again by the next Forward
  recompute_ = r;
  full_layers_ = full;
}

const char* RecomputeName(Recompute r) {
  switch (r) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
  }
  return "?";
}

void GptModel::AllocateActivations(int B, int T) {
  if (acts_ && B == cur_B_ && T == cur_T_) return;
  FreeActivations();
  KEEL_CHECK(T <= spec_.max_positions, "sequence longer than max positions");
  KEEL_CHECK(!sp_ || (B * T) % tp_ == 0,
             fmt::format("sequence parallelism splits the {} x {} tokens of a micro-batch across "
                         "{} tensor ranks: make micro-batch size x sequence length divisible by "
                         "the tensor size",
                         B, T, tp_));
  acts_ = new Activations();
  BufferSource alloc;
  alloc.backend = backend_;
  LayoutActivations(spec_, d_, B, T, nl_, stage_.head, recompute_, full_layers_, acts_, &alloc);
  cur_B_ = B;
  cur_T_ = T;
}

void GptModel::FreeActivations() {
  if (!acts_) return;
  Activations& a = *acts_;
  Backend* be = backend_;
  for (float* p :
       {a.emb,   a.emb_mean, a.emb_rstd, a.lnf,     a.lnf_mean, a.lnf_rstd, a.logits, a.losses,
        a.logz,  a.dres_a,   a.dres_b,   a.dres2,   a.dln,      a.dqkv,     a.datty,  a.dfch,
        a.dgelu, a.demb,     a.row_max,  a.ce_sums, a.chunk,    a.gathered})
    if (p) be->Free(p);
  for (float* p : a.res) be->Free(p);
  for (size_t l = 0; l < a.layers.size(); ++l) {
    Activations::Layer& y = a.layers[l];
    be->Free(y.max_logit);
    if (l > 0 && static_cast<int>(l) < a.full_layers) continue;  // layer 0's buffers
    for (float* p : {y.ln1, y.ln1_mean, y.ln1_rstd, y.qkv, y.atty, y.res2, y.ln2, y.ln2_mean,
                     y.ln2_rstd, y.fch, y.fch_gelu, y.qkv_raw, y.qk_mean, y.qk_rstd})
      if (p) be->Free(p);
    if (l == 0 || a.recompute != Recompute::kSelective) be->Free(y.att);
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

void GptModel::UseSlot(int s) {
  KEEL_CHECK(s >= 0, "micro-batch slot < 0");
  if (s == cur_slot_) return;
  if (slots_.size() <= static_cast<size_t>(std::max(s, cur_slot_))) {
    slots_.resize(std::max(s, cur_slot_) + 1);
  }
  slots_[cur_slot_] = {acts_, lowp_acts_, cur_B_, cur_T_, positions_, doc_start_, has_targets_};
  const SlotState& n = slots_[s];
  acts_ = n.acts;
  lowp_acts_ = n.lowp_acts;
  cur_B_ = n.B;
  cur_T_ = n.T;
  positions_ = n.positions;
  doc_start_ = n.doc_start;
  has_targets_ = n.has_targets;
  slots_[s] = {};
  cur_slot_ = s;
}

void GptModel::FreeAllActivations() {
  for (size_t s = 0; s < slots_.size(); ++s) {
    UseSlot(static_cast<int>(s));
    FreeActivations();
  }
  UseSlot(0);
  FreeActivations();
}

// The model's norm: LayerNorm (weight, bias; mean kept) or RMSNorm (weight; no mean, no bias).
void GptModel::NormForward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                           const float* b, int N) {
  if (spec_.rmsnorm) {
    backend_->RmsNormForward(out, rstd, inp, w, N, spec_.hidden, spec_.layernorm_eps);
  } else {
    backend_->LayerNormForward(out, mean, rstd, inp, w, b, N, spec_.hidden, spec_.layernorm_eps);
  }
}

void GptModel::NormBackward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                            const float* w, const float* mean, const float* rstd, int N) {
  if (spec_.rmsnorm) {
    backend_->RmsNormBackward(dinp, dw, dout, inp, w, rstd, N, spec_.hidden);
  } else {
    backend_->LayerNormBackward(dinp, dw, db, dout, inp, w, mean, rstd, N, spec_.hidden);
  }
}

GptModel::LayerWeights GptModel::WeightsOf(int layer) const {
  size_t pi = layer_first_param_[layer];
  const float* P = params_mem_;
  auto next = [&]() -> const float* { return P + params_[pi++].offset; };
  auto next_norm_bias = [&]() -> const float* { return spec_.rmsnorm ? nullptr : next(); };
  auto next_bias = [&]() -> const float* { return spec_.bias ? next() : nullptr; };
  LayerWeights w{};
  w.ln1w = next();
  w.ln1b = next_norm_bias();
  w.qkvw = next();
  w.qkvb = next_bias();
  if (spec_.qk_layernorm) w.qlnw = next(), w.qlnb = next(), w.klnw = next(), w.klnb = next();
  w.projw = next();
  w.projb = next_bias();
  w.ln2w = next();
  w.ln2b = next_norm_bias();
  w.fcw = next();
  w.fcb = next_bias();
  w.fcpw = next();
  w.fcpb = next_bias();
  return w;
}

void GptModel::TpAllReduce(float* x, size_t n) {
  backend_->Synchronize();
  tp_group_->AllReduceSum(x, n);
}

void GptModel::TpGatherRows(const float* mine, float* full, size_t rows) {
  backend_->Synchronize();
  tp_group_->AllGatherChunks(mine, full, rows * spec_.hidden);
}

void GptModel::TpReduceScatterRows(const float* full, float* mine, size_t rows) {
  backend_->Synchronize();
  tp_group_->ReduceScatterChunks(full, mine, rows * spec_.hidden);
}

void GptModel::FlushPartialGrads(size_t from, size_t to, bool overwrite) {
  size_t lo = SIZE_MAX, hi = 0;  // the scratch range of params_[from, to): contiguous
  for (size_t i = from; i < to; ++i) {
    if (partial_offset_[i] == SIZE_MAX) continue;
    lo = std::min(lo, partial_offset_[i]);
    hi = std::max(hi, partial_offset_[i] + params_[i].numel);
  }
  if (lo >= hi) return;
  TpAllReduce(partial_grads_ + lo, hi - lo);
  for (size_t i = from; i < to; ++i) {
    if (partial_offset_[i] == SIZE_MAX) continue;
    float* g = grads_mem_ + params_[i].offset;
    const float* sum = partial_grads_ + partial_offset_[i];
    if (overwrite) {
      backend_->Copy(g, sum, params_[i].numel);
    } else {
      backend_->Accumulate(g, sum, params_[i].numel);
    }
  }
}

void GptModel::LayerForward(int l, const LayerWeights& w) {
  Activations& a = *acts_;
  Backend* be = backend_;
  const int B = cur_B_, T = cur_T_;
  const int C = d_.C, F = d_.F, NH = d_.NH, G = d_.G, A = d_.A;
  const int W = d_.W, F1 = d_.F1;
  const int N = B * T, R = sp_ ? N / tp_ : N;  // R: this rank's rows of the residual stream
  const size_t NC = static_cast<size_t>(N) * C, NF = static_cast<size_t>(N) * F;
  const size_t NW = static_cast<size_t>(N) * W, NA = static_cast<size_t>(N) * A;
  const size_t RC = static_cast<size_t>(R) * C;
  // A matmul input in the products' 16-bit format, kept for the backward (nullptr in fp32).
  auto lowp_input = [&](uint16_t* dst, const float* x, size_t n) -> const uint16_t* {
    if (dst != nullptr) be->ToLowPrecision(dst, x, n);
    return dst;
  };
  // A row-parallel product's bias is added once: in rank 0's partial product, before the sum.
  auto row_parallel_bias = [&](const float* b) { return tp_rank_ == 0 ? b : nullptr; };
  // A norm of this rank's rows into `out` (N,C), gathered from the group under sequence
  // parallelism (the column-parallel product's input).
  auto norm_whole = [&](float* out, float* mean, float* rstd, const float* x, const float* nw,
                        const float* nb) {
    NormForward(sp_ ? a.chunk : out, mean, rstd, x, nw, nb, R);
    be->RoundToStorage(sp_ ? a.chunk : out, RC);
    if (sp_) TpGatherRows(a.chunk, out, R);
  };
  // out (R,C) = the sum over the group of the row-parallel partial product in `partial` (N,C),
  // plus the residual x: all-reduced in place, or reduce-scattered into out.
  auto row_parallel_sum = [&](float* out, float* partial, const float* x) {
    if (sp_) {
      TpReduceScatterRows(partial, out, R);
    } else if (tp_ > 1) {
      TpAllReduce(partial, NC);
    }
    be->Add(out, out, x, RC);
    be->RoundToStorage(out, RC);
  };
  Activations::Layer& y = a.layers[l];
  float* x = a.res[l];
  norm_whole(y.ln1, y.ln1_mean, y.ln1_rstd, x, w.ln1w, w.ln1b);
  const uint16_t* ln1_lowp = lowp_input(LowpInputOf(l, kLn1), y.ln1, NC);
  if (spec_.qk_layernorm) {
    be->MatmulForward(y.qkv_raw, y.ln1, w.qkvw, w.qkvb, N, C, W, Lowp(w.qkvw), ln1_lowp);
    be->QkLayerNormForward(y.qkv, y.qk_mean, y.qk_rstd, y.qkv_raw, w.qlnw, w.qlnb, w.klnw, w.klnb,
                           N, A, NH, spec_.QkLayerNormEps(), G);
    be->RoundToStorage(y.qkv, NW);
  } else {
    be->MatmulForward(y.qkv, y.ln1, w.qkvw, w.qkvb, N, C, W, Lowp(w.qkvw), ln1_lowp);
  }
  if (spec_.rope) {
    // In place: attention reads the turned q and k; the matmul's backward needs only its input.
    be->RopeForward(y.qkv, rope_cos_sin_, positions_, B, T, NH, G, d_.hs, spec_.RotaryDim());
    be->RoundToStorage(y.qkv, NW);
  }
  be->AttentionForward(y.atty, y.att, y.qkv, alibi_slopes_, B, T, A, NH, y.max_logit, doc_start_,
                       G);
  const uint16_t* atty_lowp = lowp_input(LowpInputOf(l, kAtty), y.atty, NA);
  // res2 = attn proj + x
  float* proj = sp_ ? a.gathered : y.res2;
  be->MatmulForward(proj, y.atty, w.projw, row_parallel_bias(w.projb), N, A, C, Lowp(w.projw),
                    atty_lowp);
  row_parallel_sum(y.res2, proj, x);
  norm_whole(y.ln2, y.ln2_mean, y.ln2_rstd, y.res2, w.ln2w, w.ln2b);
  be->MatmulForward(y.fch, y.ln2, w.fcw, w.fcb, N, C, F1, Lowp(w.fcw),
                    lowp_input(LowpInputOf(l, kLn2), y.ln2, NC));
  if (spec_.swiglu) {
    be->SwigluForward(y.fch_gelu, y.fch, N, F);
  } else {
    be->GeluForward(y.fch_gelu, y.fch, NF);
  }
  be->RoundToStorage(y.fch_gelu, NF);
  float* out = a.res[l + 1];
  float* fc2 = sp_ ? a.gathered : out;
  be->MatmulForward(fc2, y.fch_gelu, w.fcpw, row_parallel_bias(w.fcpb), N, F, C, Lowp(w.fcpw),
                    lowp_input(LowpInputOf(l, kFchGelu), y.fch_gelu, NF));
  row_parallel_sum(out, fc2, y.res2);
}

double GptModel::Forward(const int32_t* tokens, const int32_t* targets, int B, int T, float dloss) {
  KEEL_CHECK(whole_model(), "Forward runs the whole model; a pipeline stage runs StageForward");
  UseSlot(0);
  return ForwardImpl(tokens, nullptr, targets, B, T, dloss, nullptr);
}

void GptModel::Backward() {
  KEEL_CHECK(whole_model(), "Backward runs the whole model; a pipeline stage runs StageBackward");
  UseSlot(0);
  BackwardImpl(nullptr, nullptr);
}

size_t GptModel::StageActivationFloats(int B, int T) const {
  const size_t N = static_cast<size_t>(B) * T;
  return (sp_ ? N / tp_ : N) * spec_.hidden;
}

double GptModel::StageForward(int slot, const int32_t* tokens, const float* input,
                              const int32_t* targets, int B, int T, float dloss, float* output) {
  KEEL_CHECK(chunks_.empty(), "a chunked model computes through its chunks (chunk(c))");
  KEEL_CHECK(stage_.embedding ? tokens != nullptr : input != nullptr,
             fmt::format("StageForward of {}: the {} is missing", stage_.Describe(spec_.num_layers),
                         stage_.embedding ? "tokens" : "previous stage's output"));
  KEEL_CHECK(stage_.head || output != nullptr, "StageForward: no place for the stage's output");
  KEEL_CHECK(tokens != nullptr || !(spec_.reset_position_ids || spec_.reset_attention_mask),
             "StageForward: reset position ids or attention mask need every stage's tokens");
  UseSlot(slot);
  return ForwardImpl(tokens, stage_.embedding ? nullptr : input, stage_.head ? targets : nullptr, B,
                     T, dloss, stage_.head ? nullptr : output);
}

void GptModel::StageBackward(int slot, const float* output_grad, float* input_grad) {
  KEEL_CHECK(chunks_.empty(), "a chunked model computes through its chunks (chunk(c))");
  KEEL_CHECK(stage_.head || output_grad != nullptr,
             "StageBackward: the gradient of the stage's output is missing");
  KEEL_CHECK(stage_.embedding || input_grad != nullptr,
             "StageBackward: no place for the gradient of the stage's input");
  UseSlot(slot);
  BackwardImpl(stage_.head ? nullptr : output_grad, stage_.embedding ? nullptr : input_grad);
}

double GptModel::ForwardImpl(const int32_t* tokens, const float* input, const int32_t* targets,
                             int B, int T, float dloss, float* output) {
  AllocateActivations(B, T);
  PrepareLowPrecisionWeights();
  Activations& a = *acts_;
  Backend* be = backend_;
  const int C = spec_.hidden;
  const int N = B * T, V = spec_.vocab, Vp = d_.Vp;
  const int R = sp_ ? N / tp_ : N;  // this rank's rows of the residual stream
  const size_t NC = static_cast<size_t>(N) * C, RC = static_cast<size_t>(R) * C;
  if (lowp_params_ == nullptr) {
    if (lowp_acts_ != nullptr) be->Free(lowp_acts_);
    lowp_acts_ = nullptr;
  } else if (lowp_acts_ == nullptr) {
    lowp_acts_ = be->AllocHalves(LowpInputElements(spec_, nl_, B, T, full_layers_));
  }
  // A matmul input in the products' 16-bit format, kept for the backward (nullptr in fp32).
  auto lowp_input = [&](uint16_t* dst, const float* x, size_t n) -> const uint16_t* {
    if (dst != nullptr) be->ToLowPrecision(dst, x, n);
    return dst;
  };
  float* P = params_mem_;
  size_t pi = 0;  // walks params_ in registration order
  auto next = [&]() { return P + params_[pi++].offset; };
  // A norm's bias in the same order: null for RMSNorm.
  auto next_norm_bias = [&]() -> const float* { return spec_.rmsnorm ? nullptr : next(); };

  if (tokens != nullptr) be->CopyIntsToDevice(a.tokens, tokens, N);
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
  const float* wte = nullptr;
  if (!stage_.embedding) {
    // A later stage: its input is the previous stage's output (this rank's rows).
    be->CopyToDevice(a.res[0], input, RC);
  } else {
    wte = next();
    const float* wpe = spec_.LearnedPositions() ? next() : nullptr;
    float* emb = spec_.embed_layernorm ? a.emb : a.res[0];
    if (tp_ == 1) {
      be->EmbeddingForward(emb, a.tokens, wte, wpe, B, T, C, spec_.padded_vocab, positions);
    } else {
      // Each rank looks up its vocabulary rows (zeros elsewhere) and the sum over the group is the
      // embedding; the positions ride in rank 0's part, so they enter the sum once.
      float* part = sp_ ? a.gathered : emb;
      be->VocabParallelEmbeddingForward(part, a.tokens, wte, tp_rank_ == 0 ? wpe : nullptr, B, T, C,
                                        spec_.padded_vocab, vocab_start_, Vp, positions);
      if (sp_) {
        TpReduceScatterRows(part, emb, R);
      } else {
        TpAllReduce(part, NC);
      }
    }
    if (spec_.embed_layernorm) {
      be->RoundToStorage(a.emb, RC);
      const float* w = next();
      const float* b = next_norm_bias();
      NormForward(a.res[0], a.emb_mean, a.emb_rstd, a.emb, w, b, R);
    }
  }
  // fp16 (a no-op otherwise): every activation below is stored in fp16, as on an fp16 GPU run.
  be->RoundToStorage(a.res[0], RC);
  for (int l = 0; l < nl_; ++l) {
    LayerForward(l, WeightsOf(l));
    pi = layer_first_param_[l + 1];
  }
  if (!stage_.head) {
    be->CopyToHost(output, a.res[nl_], RC);
    has_targets_ = true;  // the backward may follow, from the next stage's gradient
    return 0.0;
  }
  const float* lnfw = next();
  const float* lnfb = next_norm_bias();
  float* lnf = sp_ ? a.chunk : a.lnf;
  NormForward(lnf, a.lnf_mean, a.lnf_rstd, a.res[nl_], lnfw, lnfb, R);
  be->RoundToStorage(lnf, RC);
  if (sp_) TpGatherRows(lnf, a.lnf, R);  // the output layer is column (vocabulary) parallel
  // The output layer: the word embedding's transpose (tied) or output_layer.weight. The logits are
  // the products' output (fp16 in fp16); the cross-entropy reads them in fp32.
  // A tied last stage without the embedding reads its own copy, after the final norm.
  const float* wout = spec_.untie_embeddings || !stage_.embedding ? next() : wte;
  be->MatmulForward(a.logits, a.lnf, wout, nullptr, N, C, Vp, Lowp(wout),
                    lowp_input(LowpLnfInput(), a.lnf, NC));
  has_targets_ = targets != nullptr;
  if (!has_targets_) return 0.0;
  be->CopyIntsToDevice(a.targets, targets, N);
  if (tp_ == 1) {
    be->CrossEntropyForwardBackward(a.losses, a.logz, a.logits, a.targets, N, V, Vp, dloss,
                                    spec_.ZLoss());
  } else {
    // Vocabulary-parallel cross-entropy: the row maximum, then the sum of exp and the target's
    // logit, reduced over the group; every rank then has the same losses and its columns' grads.
    be->VocabParallelMax(a.row_max, a.logits, N, V, vocab_start_, Vp);
    be->Synchronize();
    tp_group_->AllReduceMax(a.row_max, N);
    be->VocabParallelSumExp(a.ce_sums, a.logits, a.row_max, a.targets, N, V, vocab_start_, Vp);
    TpAllReduce(a.ce_sums, 2 * static_cast<size_t>(N));
    be->VocabParallelCrossEntropyBackward(a.losses, a.logz, a.logits, a.row_max, a.ce_sums,
                                          a.targets, N, V, vocab_start_, Vp, dloss, spec_.ZLoss());
  }
  be->CopyToHost(a.host_losses.data(), a.losses, N);
  double sum = 0.0;
  for (float v : a.host_losses) sum += v;
  return sum / N;
}

void GptModel::BackwardImpl(const float* output_grad, float* input_grad) {
  KEEL_CHECK(acts_ && has_targets_, "Backward needs a Forward with targets");
  Activations& a = *acts_;
  Backend* be = backend_;
  const int B = cur_B_, T = cur_T_;
  const int C = d_.C, F = d_.F, NH = d_.NH, G = d_.G, A = d_.A;
  const int W = d_.W, F1 = d_.F1;
  const int N = B * T, Vp = d_.Vp, R = sp_ ? N / tp_ : N;
  const size_t NC = static_cast<size_t>(N) * C, NF = static_cast<size_t>(N) * F;
  const size_t NW = static_cast<size_t>(N) * W, NF1 = static_cast<size_t>(N) * F1;
  const size_t NA = static_cast<size_t>(N) * A, RC = static_cast<size_t>(R) * C;
  float *P = params_mem_, *G_ = grads_mem_;
  // The step's first Backward writes the gradients: the matmuls overwrite theirs (weights and
  // biases); every other gradient is zeroed as the walk reaches it, before anything adds to it.
  const bool overwrite = overwrite_grads_;
  overwrite_grads_ = false;
  const bool add = !overwrite;
  // Walk the parameters backwards through the same registration order as Forward.
  size_t pi = params_.size();
  size_t flushed = params_.size();  // params_[flushed, end) have their partial sums summed
  auto prev = [&](float** grad, bool written_by_matmul = false) {
    --pi;
    if (partial_offset_[pi] != SIZE_MAX) {
      // A partial sum on this rank: into the scratch, summed over the group by flush().
      *grad = partial_grads_ + partial_offset_[pi];
      be->Zero(*grad, params_[pi].numel);
    } else {
      *grad = G_ + params_[pi].offset;
      if (overwrite && !written_by_matmul) be->Zero(*grad, params_[pi].numel);
    }
    return P + params_[pi].offset;
  };
  auto flush = [&]() {
    if (partial_numel_ > 0) FlushPartialGrads(pi, flushed, overwrite);
    flushed = pi;
  };
  constexpr bool kMatmul = true;
  // The optional tensors walked back: their gradient, or null when the model has none.
  auto prev_bias = [&](float** grad) {
    *grad = nullptr;
    if (spec_.bias) prev(grad, kMatmul);
  };
  auto prev_norm_bias = [&](float** grad) {
    *grad = nullptr;
    if (!spec_.rmsnorm) prev(grad);
  };
  // The gradient of a column-parallel product's input (a.dln, (N,C), this rank's part) summed over
  // the group: in place, or (sequence parallel) reduce-scattered to this rank's rows in a.chunk.
  // Returns where the sum is.
  auto column_parallel_input_grad = [&]() -> float* {
    if (sp_) {
      TpReduceScatterRows(a.dln, a.chunk, R);
      return a.chunk;
    }
    if (tp_ > 1) TpAllReduce(a.dln, NC);
    return a.dln;
  };
  // The gradient of a row-parallel product's output: this rank's rows `d` gathered whole under
  // sequence parallelism, else `d` itself (the same on every rank).
  auto row_parallel_output_grad = [&](const float* d) -> const float* {
    if (!sp_) return d;
    TpGatherRows(d, a.gathered, R);
    return a.gathered;
  };

  float* dwte = stage_.embedding ? G_ + params_[0].offset : nullptr;
  const float* wte = stage_.embedding ? P + params_[0].offset : nullptr;
  float* dres = a.dres_a;     // gradient w.r.t. the current residual stream
  float* dres_in = a.dres_b;  // gradient w.r.t. the previous one
  if (!stage_.head) {
    // A stage before the last: the next stage's gradient of this one's output.
    be->CopyToDevice(dres, output_grad, RC);
  } else {
    // The output layer's weight: the tied embedding's (its gradient written by this product first,
    // added to by the embedding backward last), or output_layer.weight (its own gradient; the
    // embedding's is then zeroed before the embedding backward adds to it), or a tied last stage's
    // own copy of the embedding.
    const float* wout = wte;
    float* dwout = dwte;
    if (spec_.untie_embeddings || !stage_.embedding) wout = prev(&dwout, kMatmul);
    float *dlnfb, *dlnfw;
    prev_norm_bias(&dlnfb);
    const float* lnfw = prev(&dlnfw);

    // logits = lnf wout^T: the cross-entropy left dlogits in a.logits.
    be->Zero(a.dln, NC);
    be->MatmulBackward(a.dln, dwout, nullptr, a.logits, a.lnf, wout, N, C, Vp, Lowp(wout), add,
                       LowpLnfInput());
    be->Zero(dres, RC);
    NormBackward(dres, dlnfw, dlnfb, column_parallel_input_grad(), a.res[nl_], lnfw, a.lnf_mean,
                 a.lnf_rstd, R);
    // fp16 (a no-op otherwise): activation gradients are stored in fp16 too; the matmuls and
    // attention round their own outputs.
    be->RoundToStorage(dres, RC);
    flush();
  }

  for (int l = nl_ - 1; l >= 0; --l) {
    Activations::Layer& y = a.layers[l];
    float *dfcpb, *dfcpw, *dfcb, *dfcw, *dln2b, *dln2w, *dprojb, *dprojw, *dqkvb, *dqkvw, *dln1b,
        *dln1w;
    prev_bias(&dfcpb);
    const float* fcpw = prev(&dfcpw, kMatmul);
    prev_bias(&dfcb);
    const float* fcw = prev(&dfcw, kMatmul);
    prev_norm_bias(&dln2b);
    const float* ln2w = prev(&dln2w);
    prev_bias(&dprojb);
    const float* projw = prev(&dprojw, kMatmul);
    float *dklnb = nullptr, *dklnw = nullptr, *dqlnb = nullptr, *dqlnw = nullptr;
    const float *klnw = nullptr, *qlnw = nullptr;
    if (spec_.qk_layernorm) {
      prev(&dklnb);
      klnw = prev(&dklnw);
      prev(&dqlnb);
      qlnw = prev(&dqlnw);
    }
    prev_bias(&dqkvb);
    const float* qkvw = prev(&dqkvw, kMatmul);
    prev_norm_bias(&dln1b);
    const float* ln1w = prev(&dln1w);
    // Full recomputation: the layer's activations again, from its kept input (the last
    // recomputed layer's are still in the shared buffers from the forward).
    if (l + 1 < full_layers_) LayerForward(l, WeightsOf(l));

    // res[l+1] = res2 + fcproj(act(fc(ln2(res2))))
    be->Copy(a.dres2, dres, RC);  // skip connection
    be->Zero(a.dgelu, NF);
    be->MatmulBackward(a.dgelu, dfcpw, dfcpb, row_parallel_output_grad(dres), y.fch_gelu, fcpw, N,
                       F, C, Lowp(fcpw), add, LowpInputOf(l, kFchGelu));
    be->Zero(a.dfch, NF1);
    if (spec_.swiglu) {
      be->SwigluBackward(a.dfch, y.fch, a.dgelu, N, F);
    } else {
      be->GeluBackward(a.dfch, y.fch, a.dgelu, NF);
    }
    be->RoundToStorage(a.dfch, NF1);
    be->Zero(a.dln, NC);
    be->MatmulBackward(a.dln, dfcw, dfcb, a.dfch, y.ln2, fcw, N, C, F1, Lowp(fcw), add,
                       LowpInputOf(l, kLn2));
    NormBackward(a.dres2, dln2w, dln2b, column_parallel_input_grad(), y.res2, ln2w, y.ln2_mean,
                 y.ln2_rstd, R);
    be->RoundToStorage(a.dres2, RC);
    // res2 = x + proj(attn(rope(qkv(ln1(x)))))
    be->Copy(dres_in, a.dres2, RC);  // skip connection
    be->Zero(a.datty, NA);
    be->MatmulBackward(a.datty, dprojw, dprojb, row_parallel_output_grad(a.dres2), y.atty, projw, N,
                       A, C, Lowp(projw), add, LowpInputOf(l, kAtty));
    if (recompute_ == Recompute::kSelective && l + 1 < nl_) {
      // The shared buffer holds a later layer's probabilities: this layer's again (the output
      // written beside them is the same bits as the forward's).
      be->AttentionForward(y.atty, y.att, y.qkv, alibi_slopes_, B, T, A, NH, y.max_logit,
                           doc_start_, G);
    }
    be->Zero(a.dqkv, NW);
    be->AttentionBackward(a.dqkv, a.datty, y.qkv, y.att, B, T, A, NH, G);
    if (spec_.rope) {
      be->RopeBackward(a.dqkv, rope_cos_sin_, positions_, B, T, NH, G, d_.hs, spec_.RotaryDim());
      be->RoundToStorage(a.dqkv, NW);
    }
    float* dqkv_mm = a.dqkv;  // gradient w.r.t. the matmul's output
    if (spec_.qk_layernorm) {
      be->Zero(a.dqkv_raw, NW);
      be->QkLayerNormBackward(a.dqkv_raw, dqlnw, dqlnb, dklnw, dklnb, a.dqkv, y.qkv_raw, qlnw, klnw,
                              y.qk_mean, y.qk_rstd, N, A, NH, G);
      be->RoundToStorage(a.dqkv_raw, NW);
      dqkv_mm = a.dqkv_raw;
    }
    be->Zero(a.dln, NC);
    be->MatmulBackward(a.dln, dqkvw, dqkvb, dqkv_mm, y.ln1, qkvw, N, C, W, Lowp(qkvw), add,
                       LowpInputOf(l, kLn1));
    NormBackward(dres_in, dln1w, dln1b, column_parallel_input_grad(), a.res[l], ln1w, y.ln1_mean,
                 y.ln1_rstd, R);
    be->RoundToStorage(dres_in, RC);
    std::swap(dres, dres_in);
    flush();
    // Layer l and everything after it in the buffer (later layers, the final norm, an untied
    // output layer) are final.
    if (grad_ready_) grad_ready_(params_[pi].offset);
  }
  // dres now holds the gradient w.r.t. res[0].
  if (!stage_.embedding) {
    be->CopyToHost(input_grad, dres, RC);  // for the previous stage
    return;
  }
  float* dwpe = nullptr;
  const float* demb = dres;
  if (spec_.embed_layernorm) {
    float *delnb, *delnw;
    prev_norm_bias(&delnb);
    const float* elnw = prev(&delnw);
    be->Zero(a.demb, RC);
    NormBackward(a.demb, delnw, delnb, dres, a.emb, elnw, a.emb_mean, a.emb_rstd, R);
    be->RoundToStorage(a.demb, RC);
    demb = a.demb;
  }
  if (spec_.LearnedPositions()) prev(&dwpe);
  flush();
  // No product of this model wrote the embedding's gradient first (untied, or the head elsewhere).
  if ((spec_.untie_embeddings || !stage_.head) && overwrite) be->Zero(dwte, params_[0].numel);
  if (tp_ == 1) {
    be->EmbeddingBackward(dwte, dwpe, demb, a.tokens, B, T, C, spec_.padded_vocab, positions_);
  } else {
    // The embedding's sum over the group is replicated: its gradient, whole, goes to this rank's
    // vocabulary rows; every rank adds all positions' (the same bits on each).
    be->VocabParallelEmbeddingBackward(dwte, dwpe, row_parallel_output_grad(demb), a.tokens, B, T,
                                       C, spec_.padded_vocab, vocab_start_, Vp, positions_);
  }
}

void GptModel::ZeroGrad() {
  backend_->Zero(grads_mem_, num_params_);
}

std::vector<float> GptModel::LogitsAt(int b, int t) {
  KEEL_CHECK(stage_.head, "LogitsAt needs the stage with the output layer");
  KEEL_CHECK(acts_ && b < cur_B_ && t < cur_T_, "LogitsAt out of range");
  KEEL_CHECK(!has_targets_, "LogitsAt needs a Forward without targets (logits are gradients)");
  if (tp_ > 1) {
    // Every rank's columns of the row, in rank order: the whole padded row.
    std::vector<float> mine(d_.Vp);
    const size_t off = (static_cast<size_t>(b) * cur_T_ + t) * d_.Vp;
    backend_->CopyToHost(mine.data(), acts_->logits + off, d_.Vp);
    std::vector<std::string> all;
    tp_group_->AllGatherBytes(
        std::string(reinterpret_cast<const char*>(mine.data()), mine.size() * sizeof(float)), &all);
    std::vector<float> row(spec_.vocab);
    for (int r = 0; r < tp_; ++r) {
      const int64_t lo = static_cast<int64_t>(r) * d_.Vp;
      const int64_t n = std::clamp<int64_t>(spec_.vocab - lo, 0, d_.Vp);
      if (n > 0) std::memcpy(row.data() + lo, all[r].data(), n * sizeof(float));
    }
    return row;
  }
  std::vector<float> row(spec_.vocab);
  const size_t off = (static_cast<size_t>(b) * cur_T_ + t) * spec_.padded_vocab;
  backend_->CopyToHost(row.data(), acts_->logits + off, spec_.vocab);
  return row;
}

double GptModel::LastZLoss() {
  KEEL_CHECK(stage_.head && acts_ && has_targets_, "LastZLoss needs a Forward with targets");
  if (spec_.ZLoss() == 0.0f) return 0.0;
  const int N = cur_B_ * cur_T_;
  std::vector<float> h(N);
  backend_->CopyToHost(h.data(), acts_->logz, N);
  double s = 0.0;
  for (float v : h) s += double(v) * v;
  return spec_.ZLoss() * s / N;
}

double GptModel::LastMaxAttentionLogit() {
  KEEL_CHECK(acts_ != nullptr, "LastMaxAttentionLogit needs a Forward");
  const size_t n = static_cast<size_t>(cur_B_) * d_.NH;
  std::vector<float> h(n);
  double mx = -INFINITY;
  for (const auto& y : acts_->layers) {
    backend_->CopyToHost(h.data(), y.max_logit, n);
    for (float v : h) mx = std::max(mx, double(v));
  }
  if (tp_ > 1) tp_group_->AllReduceMaxHost(&mx, 1);  // the other ranks' heads
  return mx;
}

double GptModel::SequenceLoss(int b) const {
  KEEL_CHECK(stage_.head && acts_ && has_targets_ && b >= 0 && b < cur_B_,
             "SequenceLoss needs a Forward with targets");
  const float* row = acts_->host_losses.data() + static_cast<size_t>(b) * cur_T_;
  double s = 0.0;
  for (int t = 0; t < cur_T_; ++t) s += row[t];
  return s / cur_T_;
}

double GptModel::MeanLogZ() {
  KEEL_CHECK(stage_.head && acts_ && has_targets_, "MeanLogZ needs a Forward with targets");
  const int N = cur_B_ * cur_T_;
  std::vector<float> h(N);
  backend_->CopyToHost(h.data(), acts_->logz, N);
  double s = 0.0;
  for (float v : h) s += v;
  return s / N;
}

Status CheckBackendSupports(const Backend& backend, const GptSpec& spec, Precision p, int tensor) {
  struct Need {
    Op op;
    const char* setting;  // what in the config makes the run call it
  };
  const char* every = "every model";
  std::vector<Need> needs = {
      {Op::kEmbeddingForward, every},
      {Op::kEmbeddingBackward, every},
      {Op::kMatmulForward, every},
      {Op::kMatmulBackward, every},
      {Op::kAttentionForward, every},
      {Op::kAttentionBackward, every},
      {Op::kAdd, every},
      {Op::kRoundToStorage, every},
      {Op::kCrossEntropyForwardBackward, every},
      {Op::kSumSquaresAndZeros, every},
      {Op::kCountNonFinite, every},
      {Op::kAdamWUpdate, every},
  };
  const char* norm = spec.rmsnorm ? "--normalization RMSNorm" : "--normalization LayerNorm";
  const Op norm_ops[2] = {spec.rmsnorm ? Op::kRmsNormForward : Op::kLayerNormForward,
                          spec.rmsnorm ? Op::kRmsNormBackward : Op::kLayerNormBackward};
  for (Op op : norm_ops) needs.push_back({op, norm});
  if (spec.qk_layernorm) {
    needs.push_back({Op::kQkLayerNormForward, "--qk-layernorm"});
    needs.push_back({Op::kQkLayerNormBackward, "--qk-layernorm"});
  }
  if (spec.rope) {
    needs.push_back({Op::kRopeForward, "--position-embedding-type rope"});
    needs.push_back({Op::kRopeBackward, "--position-embedding-type rope"});
  }
  const char* mlp = spec.swiglu ? "--swiglu" : "the GELU MLP (no --swiglu)";
  needs.push_back({spec.swiglu ? Op::kSwigluForward : Op::kGeluForward, mlp});
  needs.push_back({spec.swiglu ? Op::kSwigluBackward : Op::kGeluBackward, mlp});
  if (tensor > 1) {
    const char* tp = "--tensor-model-parallel-size > 1";
    for (Op op :
         {Op::kVocabParallelEmbeddingForward, Op::kVocabParallelEmbeddingBackward,
          Op::kVocabParallelMax, Op::kVocabParallelSumExp, Op::kVocabParallelCrossEntropyBackward})
      needs.push_back({op, tp});
  }
  const std::string precision_flag = fmt::format("--{}", PrecisionName(p));
  if (p != Precision::kFp32) needs.push_back({Op::kToLowPrecision, precision_flag.c_str()});
  for (const Need& n : needs) {
    if (backend.Supports(n.op, p)) continue;
    // An op the backend has in fp32 but not in this precision is the precision flag's doing.
    if (p != Precision::kFp32 && backend.Supports(n.op, Precision::kFp32)) {
      return Status::InvalidArgument(fmt::format("backend {} lacks {} in {}, needed by {}",
                                                 backend.Name(), OpName(n.op), PrecisionName(p),
                                                 precision_flag));
    }
    return Status::InvalidArgument(
        fmt::format("backend {} lacks {}, needed by {}", backend.Name(), OpName(n.op), n.setting));
  }
  return Status::OK();
}

}  // namespace keel

#include "hf/hf_arch.h"

#include <fmt/format.h>

#include <cstring>

namespace keel {
namespace {

constexpr const char* kWhatKeelExports =
    "keel exports GPT-2 (learned positions, LayerNorm, GELU), Llama (--position-embedding-type "
    "rope --normalization RMSNorm --swiglu, every dimension rotary) and BLOOM "
    "(--position-embedding-type alibi --embed-layernorm, LayerNorm, GELU, FFN 4h, tied output "
    "layer, biases)";

Status Refuse(HfArch arch, const std::string& feature) {
  return Status::InvalidArgument(
      fmt::format("the model {}, which Hugging Face {} cannot represent; {}", feature,
                  HfArchTitle(arch), kWhatKeelExports));
}

// Values per row: a 1-D tensor has rows of one value.
int64_t RowWidth(const std::vector<int64_t>& shape) {
  int64_t w = 1;
  for (size_t i = 1; i < shape.size(); ++i) w *= shape[i];
  return w;
}

// Builds the table of one architecture.
class Table {
 public:
  explicit Table(std::vector<HfTensorMapping>* out) : out_(out) {}
  // The keel tensor as it is, or its first rows (the vocabulary slice).
  void Rows(const std::string& hf, std::vector<int64_t> hf_shape, const std::string& keel,
            std::vector<int64_t> keel_shape, int64_t row_begin = 0) {
    out_->push_back(
        {hf, std::move(hf_shape), keel, std::move(keel_shape), HfLayout::kRows, row_begin, 0});
  }
  void Same(const std::string& hf, const std::string& keel, std::vector<int64_t> shape) {
    Rows(hf, shape, keel, shape);
  }
  // A Linear weight [out, in] as a Conv1D weight [in, out].
  void Transposed(const std::string& hf, const std::string& keel, int64_t out_f, int64_t in_f) {
    out_->push_back({hf, {in_f, out_f}, keel, {out_f, in_f}, HfLayout::kTransposed, 0, 0});
  }
  void BloomQkv(const std::string& hf, const std::string& keel, std::vector<int64_t> shape,
                int64_t heads) {
    out_->push_back({hf, shape, keel, shape, HfLayout::kBloomQkv, 0, heads});
  }

 private:
  std::vector<HfTensorMapping>* out_;
};

void Gpt2Table(const GptSpec& s, Table* t) {
  const int64_t C = s.hidden, F = s.ffn_hidden, V = s.vocab, Vp = s.padded_vocab;
  const int64_t P = s.max_positions;
  t->Rows("wte.weight", {V, C}, "embedding.word_embeddings.weight", {Vp, C});
  t->Same("wpe.weight", "embedding.position_embeddings.weight", {P, C});
  for (int l = 0; l < s.num_layers; ++l) {
    const std::string k = "layers." + std::to_string(l) + ".", h = "h." + std::to_string(l) + ".";
    t->Same(h + "ln_1.weight", k + "input_layernorm.weight", {C});
    t->Same(h + "ln_1.bias", k + "input_layernorm.bias", {C});
    t->Transposed(h + "attn.c_attn.weight", k + "attention.query_key_value.weight", 3 * C, C);
    t->Same(h + "attn.c_attn.bias", k + "attention.query_key_value.bias", {3 * C});
    t->Transposed(h + "attn.c_proj.weight", k + "attention.dense.weight", C, C);
    t->Same(h + "attn.c_proj.bias", k + "attention.dense.bias", {C});
    t->Same(h + "ln_2.weight", k + "post_attention_layernorm.weight", {C});
    t->Same(h + "ln_2.bias", k + "post_attention_layernorm.bias", {C});
    t->Transposed(h + "mlp.c_fc.weight", k + "mlp.dense_h_to_4h.weight", F, C);
    t->Same(h + "mlp.c_fc.bias", k + "mlp.dense_h_to_4h.bias", {F});
    t->Transposed(h + "mlp.c_proj.weight", k + "mlp.dense_4h_to_h.weight", C, F);
    t->Same(h + "mlp.c_proj.bias", k + "mlp.dense_4h_to_h.bias", {C});
  }
  t->Same("ln_f.weight", "final_layernorm.weight", {C});
  t->Same("ln_f.bias", "final_layernorm.bias", {C});
  if (s.untie_embeddings) t->Rows("lm_head.weight", {V, C}, "output_layer.weight", {Vp, C});
}

void LlamaTable(const GptSpec& s, Table* t) {
  const int64_t C = s.hidden, F = s.ffn_hidden, V = s.vocab, Vp = s.padded_vocab;
  const int64_t hs = s.HeadDim(), q = s.heads * hs, kv = s.KvHeads() * hs, W = s.QkvWidth();
  t->Rows("model.embed_tokens.weight", {V, C}, "embedding.word_embeddings.weight", {Vp, C});
  for (int l = 0; l < s.num_layers; ++l) {
    const std::string k = "layers." + std::to_string(l) + ".";
    const std::string h = "model.layers." + std::to_string(l) + ".";
    t->Same(h + "input_layernorm.weight", k + "input_layernorm.weight", {C});
    // keel's fused QKV rows are [q: NH heads | k: G heads | v: G heads], HF's projections the same
    // heads in the same order, so each is a block of rows.
    const std::string qkv = k + "attention.query_key_value.";
    t->Rows(h + "self_attn.q_proj.weight", {q, C}, qkv + "weight", {W, C}, 0);
    if (s.bias) t->Rows(h + "self_attn.q_proj.bias", {q}, qkv + "bias", {W}, 0);
    t->Rows(h + "self_attn.k_proj.weight", {kv, C}, qkv + "weight", {W, C}, q);
    if (s.bias) t->Rows(h + "self_attn.k_proj.bias", {kv}, qkv + "bias", {W}, q);
    t->Rows(h + "self_attn.v_proj.weight", {kv, C}, qkv + "weight", {W, C}, q + kv);
    if (s.bias) t->Rows(h + "self_attn.v_proj.bias", {kv}, qkv + "bias", {W}, q + kv);
    t->Same(h + "self_attn.o_proj.weight", k + "attention.dense.weight", {C, C});
    if (s.bias) t->Same(h + "self_attn.o_proj.bias", k + "attention.dense.bias", {C});
    t->Same(h + "post_attention_layernorm.weight", k + "post_attention_layernorm.weight", {C});
    // SwiGLU's first weight is [gate (F) | up (F)]: act = silu(gate) * up, as HF's MLP.
    const std::string fc1 = k + "mlp.dense_h_to_4h.";
    t->Rows(h + "mlp.gate_proj.weight", {F, C}, fc1 + "weight", {2 * F, C}, 0);
    if (s.bias) t->Rows(h + "mlp.gate_proj.bias", {F}, fc1 + "bias", {2 * F}, 0);
    t->Rows(h + "mlp.up_proj.weight", {F, C}, fc1 + "weight", {2 * F, C}, F);
    if (s.bias) t->Rows(h + "mlp.up_proj.bias", {F}, fc1 + "bias", {2 * F}, F);
    t->Same(h + "mlp.down_proj.weight", k + "mlp.dense_4h_to_h.weight", {C, F});
    if (s.bias) t->Same(h + "mlp.down_proj.bias", k + "mlp.dense_4h_to_h.bias", {C});
  }
  t->Same("model.norm.weight", "final_layernorm.weight", {C});
  if (s.untie_embeddings) t->Rows("lm_head.weight", {V, C}, "output_layer.weight", {Vp, C});
}

void BloomTable(const GptSpec& s, Table* t) {
  const int64_t C = s.hidden, F = s.ffn_hidden, V = s.vocab, Vp = s.padded_vocab;
  t->Rows("word_embeddings.weight", {V, C}, "embedding.word_embeddings.weight", {Vp, C});
  t->Same("word_embeddings_layernorm.weight", "embedding.layernorm.weight", {C});
  t->Same("word_embeddings_layernorm.bias", "embedding.layernorm.bias", {C});
  for (int l = 0; l < s.num_layers; ++l) {
    const std::string k = "layers." + std::to_string(l) + ".", h = "h." + std::to_string(l) + ".";
    t->Same(h + "input_layernorm.weight", k + "input_layernorm.weight", {C});
    t->Same(h + "input_layernorm.bias", k + "input_layernorm.bias", {C});
    t->BloomQkv(h + "self_attention.query_key_value.weight", k + "attention.query_key_value.weight",
                {3 * C, C}, s.heads);
    t->BloomQkv(h + "self_attention.query_key_value.bias", k + "attention.query_key_value.bias",
                {3 * C}, s.heads);
    t->Same(h + "self_attention.dense.weight", k + "attention.dense.weight", {C, C});
    t->Same(h + "self_attention.dense.bias", k + "attention.dense.bias", {C});
    t->Same(h + "post_attention_layernorm.weight", k + "post_attention_layernorm.weight", {C});
    t->Same(h + "post_attention_layernorm.bias", k + "post_attention_layernorm.bias", {C});
    t->Same(h + "mlp.dense_h_to_4h.weight", k + "mlp.dense_h_to_4h.weight", {F, C});
    t->Same(h + "mlp.dense_h_to_4h.bias", k + "mlp.dense_h_to_4h.bias", {F});
    t->Same(h + "mlp.dense_4h_to_h.weight", k + "mlp.dense_4h_to_h.weight", {C, F});
    t->Same(h + "mlp.dense_4h_to_h.bias", k + "mlp.dense_4h_to_h.bias", {C});
  }
  t->Same("ln_f.weight", "final_layernorm.weight", {C});
  t->Same("ln_f.bias", "final_layernorm.bias", {C});
}

// BLOOM's fused QKV row of keel row r (a row of block b = q, k, v, head h, dim d): HF splits each
// head's 3*hs outputs into its q, k and v (modeling_bloom's _split_heads).
int64_t BloomRow(int64_t r, int64_t heads, int64_t hs) {
  const int64_t C = heads * hs;
  const int64_t b = r / C, h = (r % C) / hs, d = r % hs;
  return h * 3 * hs + b * hs + d;
}

}  // namespace

const char* HfModelType(HfArch arch) {
  switch (arch) {
    case HfArch::kGpt2:
      return "gpt2";
    case HfArch::kLlama:
      return "llama";
    case HfArch::kBloom:
      return "bloom";
  }
  return "?";
}

const char* HfModelClass(HfArch arch) {
  switch (arch) {
    case HfArch::kGpt2:
      return "GPT2LMHeadModel";
    case HfArch::kLlama:
      return "LlamaForCausalLM";
    case HfArch::kBloom:
      return "BloomForCausalLM";
  }
  return "?";
}

const char* HfArchTitle(HfArch arch) {
  switch (arch) {
    case HfArch::kGpt2:
      return "GPT-2";
    case HfArch::kLlama:
      return "Llama";
    case HfArch::kBloom:
      return "BLOOM";
  }
  return "?";
}

Status HfArchForSpec(const GptSpec& s, HfArch* arch) {
  const HfArch a = s.rope ? HfArch::kLlama : s.alibi ? HfArch::kBloom : HfArch::kGpt2;
  *arch = a;
  if (s.qk_layernorm) return Refuse(a, "normalises queries and keys (--qk-layernorm)");
  const bool gqa = s.KvHeads() != s.heads;
  switch (a) {
    case HfArch::kGpt2:
      if (s.embed_layernorm)
        return Refuse(a,
                      "has a LayerNorm after the word embedding (--embed-layernorm, BLOOM style)");
      if (s.rmsnorm)
        return Refuse(a, "uses RMSNorm (--normalization RMSNorm) with learned positions");
      if (s.swiglu) return Refuse(a, "uses SwiGLU (--swiglu) with learned positions");
      if (gqa)
        return Refuse(a, fmt::format("uses grouped-query attention ({} key/value heads for {} "
                                     "heads, --num-query-groups)",
                                     s.KvHeads(), s.heads));
      if (!s.bias) return Refuse(a, "has no linear biases (--disable-bias-linear)");
      return Status::OK();
    case HfArch::kLlama:
      if (!s.rmsnorm)
        return Refuse(a,
                      "uses RoPE with LayerNorm (Llama's norms are RMSNorm: --normalization "
                      "RMSNorm)");
      if (!s.swiglu) return Refuse(a, "uses RoPE with a GELU MLP (Llama's MLP is gated: --swiglu)");
      if (s.RotaryDim() != s.HeadDim())
        return Refuse(a, fmt::format("turns only {} of the {} dimensions of each head "
                                     "(--rotary-percent {}: partial rotary)",
                                     s.RotaryDim(), s.HeadDim(), s.rotary_percent));
      if (s.embed_layernorm)
        return Refuse(a, "has a LayerNorm after the word embedding (--embed-layernorm)");
      return Status::OK();
    case HfArch::kBloom:
      if (!s.embed_layernorm)
        return Refuse(a,
                      "uses ALiBi without a LayerNorm after the word embedding (BLOOM has one: "
                      "--embed-layernorm); Hugging Face GPT-2 and Llama cannot represent ALiBi");
      if (s.rmsnorm) return Refuse(a, "uses RMSNorm (--normalization RMSNorm)");
      if (s.swiglu) return Refuse(a, "uses SwiGLU (--swiglu)");
      if (gqa)
        return Refuse(a, fmt::format("uses grouped-query attention ({} key/value heads for {} "
                                     "heads, --num-query-groups)",
                                     s.KvHeads(), s.heads));
      if (s.untie_embeddings)
        return Refuse(a, "has an output layer of its own (--untie-embeddings-and-output-weights)");
      if (!s.bias) return Refuse(a, "has no linear biases (--disable-bias-linear)");
      if (s.ffn_hidden != 4 * s.hidden)
        return Refuse(a, fmt::format("has FFN size {}, not 4 x hidden = {} (BLOOM's MLP is "
                                     "always 4h)",
                                     s.ffn_hidden, 4 * s.hidden));
      return Status::OK();
  }
  return Status::OK();
}

std::vector<HfTensorMapping> HfTensorMappings(HfArch arch, const GptSpec& spec) {
  std::vector<HfTensorMapping> out;
  Table t(&out);
  switch (arch) {
    case HfArch::kGpt2:
      Gpt2Table(spec, &t);
      break;
    case HfArch::kLlama:
      LlamaTable(spec, &t);
      break;
    case HfArch::kBloom:
      BloomTable(spec, &t);
      break;
  }
  return out;
}

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const float* HfViewOf(const HfTensorMapping& m, const float* keel) {
  return keel + m.row_begin * RowWidth(m.keel_shape);
}

void KeelToHf(const HfTensorMapping& m, const float* keel, float* hf) {
  switch (m.layout) {
    case HfLayout::kRows:
      std::memcpy(hf, HfViewOf(m, keel),
                  static_cast<size_t>(NumElements(m.hf_shape)) * sizeof(float));
      return;
    case HfLayout::kTransposed: {
      const int64_t rows = m.keel_shape[0], cols = m.keel_shape[1];
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) hf[c * rows + r] = keel[r * cols + c];
      return;
    }
    case HfLayout::kBloomQkv: {
      const int64_t rows = m.keel_shape[0], w = RowWidth(m.keel_shape);
      const int64_t hs = rows / (3 * m.heads);
      for (int64_t r = 0; r < rows; ++r)
        std::memcpy(hf + BloomRow(r, m.heads, hs) * w, keel + r * w,
                    static_cast<size_t>(w) * sizeof(float));
      return;
    }
  }
}

void HfToKeel(const HfTensorMapping& m, const float* hf, float* keel) {
  switch (m.layout) {
    case HfLayout::kRows:
      std::memcpy(keel + m.row_begin * RowWidth(m.keel_shape), hf,
                  static_cast<size_t>(NumElements(m.hf_shape)) * sizeof(float));
      return;
    case HfLayout::kTransposed: {
      const int64_t rows = m.keel_shape[0], cols = m.keel_shape[1];
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) keel[r * cols + c] = hf[c * rows + r];
      return;
    }
    case HfLayout::kBloomQkv: {
      const int64_t rows = m.keel_shape[0], w = RowWidth(m.keel_shape);
      const int64_t hs = rows / (3 * m.heads);
      for (int64_t r = 0; r < rows; ++r)
        std::memcpy(keel + r * w, hf + BloomRow(r, m.heads, hs) * w,
                    static_cast<size_t>(w) * sizeof(float));
      return;
    }
  }
}

}  // namespace keel

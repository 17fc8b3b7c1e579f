// The model's shape, described once: GptSpec is both the `model` part of a TrainConfig (what the
// flags and TOML keys set, cfg.model) and what GptModel is built from. One table of its fields
// (ShapeFields, model_shape.cc) gives each field's setting name, its key in a checkpoint's `model`
// JSON and the default when a checkpoint lacks it, its limits, and where it is one integer of a
// Hugging Face config.json, its key there; the checkpoint JSON (ShapeToJson / ShapeFromJson), the
// limits of a config and of a checkpoint being read (CheckShape), the resume rules' list of shape
// settings and the 1:1 part of the Hugging Face config mapping all read that table. The settings
// table (config_settings.cc) holds the flags' help text and types, as it does for every setting.
//
// Adding a shape option: a member here, a row in ShapeFields, a row in the settings table, the
// model's use of it, and their tests.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"

namespace keel {

class JsonValue;

enum class PositionEmbedding { kLearnedAbsolute, kAlibi, kRope };
enum class Normalization { kLayerNorm, kRmsNorm };

// The defaults are the default job's (config/train_config.h); the setting of each member is in
// parentheses (Megatron-LM's flags).
struct GptSpec {
  int num_layers = 4;     // (--num-layers)
  int hidden = 256;       // C (--hidden-size)
  int ffn_hidden = 0;     // F (--ffn-hidden-size; 0 until Validate resolves it: 4h, SwiGLU 8h/3)
  int heads = 4;          // NH (--num-attention-heads)
  int max_positions = 0;  // (--max-position-embeddings; 0 until Validate resolves it: seq-length)
  // From the data, not settings: the tokenizer's vocabulary and the padded vocabulary Vp
  // (Validate pads it: --make-vocab-size-divisible-by / --pad-vocab-size-to).
  int vocab = 0;
  int padded_vocab = 0;
  // Positions (--position-embedding-type): learned absolute (neither), ALiBi (here) or RoPE
  // (below). The members keep the order they had, which aggregate initialisers rely on.
  bool alibi = false;
  bool embed_layernorm = false;  // BLOOM: LayerNorm right after the word embedding
  float layernorm_eps = 1e-5f;   // (--layernorm-epsilon)
  bool qk_layernorm = false;     // LayerNorm of each head's query and key (docs/stability.md)
  double z_loss = 0;             // PaLM's z-loss coefficient, e.g. 1e-4 (0: off; docs/stability.md)
  // Packed documents (Megatron's --reset-position-ids / --reset-attention-mask): after each
  // eod_id token of the input (the data's document separator), positions restart at 0 and/or
  // attention stops at the boundary.
  bool reset_position_ids = false;
  bool reset_attention_mask = false;
  int32_t eod_id = -1;
  bool rope = false;
  // The Llama family (docs/llama.md).
  int rotary_base = 10000;      // RoPE: w_i = base^(-2i/rot) (--rotary-base)
  double rotary_percent = 1.0;  // share of each head's dims that turn (--rotary-percent)
  // RoPE frequency scaling for contexts longer than pretraining's, one at most: Llama 3.x's bands
  // (--use-rope-scaling and its four settings, Megatron-LM's defaults; Hugging Face's rope_type
  // "llama3"), or positions divided by a whole factor (--rotary-seq-len-interpolation-factor;
  // Hugging Face's "linear"; 0 or 1: none).
  bool rope_llama3 = false;
  double rope_llama3_factor = 8;
  double rope_low_freq_factor = 1;
  double rope_high_freq_factor = 4;
  int rope_original_max_positions = 8192;
  int rope_interpolation_factor = 0;
  bool rmsnorm = false;  // RMSNorm for every norm but QK-LayerNorm (--normalization RMSNorm)
  bool swiglu = false;   // gated FFN: W1 is (2F, C), [gate | up] (--swiglu)
  // Grouped-query attention: num_query_groups key/value heads G shared by the query heads.
  bool group_query_attention = false;
  int num_query_groups = 1;
  bool untie_embeddings = false;  // output_layer.weight of its own (--untie-embeddings-...)
  bool bias = true;               // biases in the linear layers (off: --disable-bias-linear)
  // Epsilon of QK-LayerNorm (--qk-layernorm-epsilon); 0: layernorm_eps, as before the setting.
  float qk_layernorm_eps = 0;

  // Key/value heads G: num_query_groups with grouped-query attention, else one per query head.
  int KvHeads() const { return group_query_attention ? num_query_groups : heads; }
  // G key/value heads (0: one per query head).
  void SetKvHeads(int g) {
    group_query_attention = g > 0;
    num_query_groups = g > 0 ? g : 1;
  }
  int HeadDim() const { return hidden / heads; }
  // Rows of the fused QKV weight: NH query heads, then G key and G value heads.
  int QkvWidth() const { return (heads + 2 * KvHeads()) * HeadDim(); }
  // Rows of the first FFN weight: F, or 2F with SwiGLU (gate then up).
  int Fc1Width() const { return swiglu ? 2 * ffn_hidden : ffn_hidden; }
  // Dimensions of each head that RoPE turns (even; Megatron's int(hs * rotary_percent)).
  int RotaryDim() const { return static_cast<int>(HeadDim() * rotary_percent) / 2 * 2; }
  bool LearnedPositions() const { return !alibi && !rope; }
  PositionEmbedding Position() const {
    return rope    ? PositionEmbedding::kRope
           : alibi ? PositionEmbedding::kAlibi
                   : PositionEmbedding::kLearnedAbsolute;
  }
  void SetPosition(PositionEmbedding p) {
    alibi = p == PositionEmbedding::kAlibi;
    rope = p == PositionEmbedding::kRope;
  }
  // The scalings the model applies (the settings of an unused one are kept, and ignored).
  bool RopeLlama3() const { return rope && rope_llama3; }
  double RopeLinearFactor() const {
    return rope && rope_interpolation_factor > 1 ? rope_interpolation_factor : 1.0;
  }
  // The epsilon QK-LayerNorm computes with.
  float QkLayerNormEps() const { return qk_layernorm_eps > 0 ? qk_layernorm_eps : layernorm_eps; }
  // The coefficient the model computes with (fp32, as the kernels take it).
  float ZLoss() const { return static_cast<float>(z_loss); }
};

// kGiven: a config as the user gave it (a size of 0 may still be resolved: FFN, positions; the
// vocabulary may be unknown yet). kResolved: a model to build (a checkpoint being read).
enum class ShapeCheck { kGiven, kResolved };

// One field of the shape.
struct ShapeField {
  std::string setting;   // its flag / TOML key without dashes ("": from the data, no setting)
  std::string json_key;  // its key in a checkpoint's `model` object
  // A resume may change it (as a scheduler or data-order change: z-loss, reset-*) instead of
  // refusing every change (the shape proper).
  bool resumable = false;
  // Writes the field into a checkpoint's `model` object (some only where they are on, so that
  // the files of models without them stay as they were).
  std::function<void(const GptSpec&, nlohmann::json*)> to_json;
  // Reads it from a `model` object (a JsonValue of a JsonReader, which keeps the first error), or
  // the value of checkpoints written before the field existed.
  std::function<void(const JsonValue&, GptSpec*)> from_json;
  // Its limits; InvalidArgument naming the setting, the value, the rule and a fix.
  std::function<Status(const GptSpec&, ShapeCheck)> check;
  // Where it is one integer of a Hugging Face config.json (hf/hf_config.cc): per architecture
  // (GPT-2, Llama, BLOOM, as hf/hf_arch.h's HfArch) the key it is written as, then the other
  // spellings it is read from; empty where the mapping is not 1:1 (computed, or not there).
  std::vector<const char*> hf_keys[3];
  int GptSpec::*hf_member = nullptr;  // the member those keys hold
};
const std::vector<ShapeField>& ShapeFields();

// The checkpoint's `model` object of `spec`, and back (errors go to the JsonValue's reader;
// nothing is checked here: CheckShape).
nlohmann::json ShapeToJson(const GptSpec& spec);
void ShapeFromJson(const JsonValue& model, GptSpec* spec);

// Every field's limits, then the rules between fields (heads divide the hidden size, key/value
// groups divide the heads, RoPE's dims and scaling, ...). The first violation, with the setting's
// flag in its message.
Status CheckShape(const GptSpec& spec, ShapeCheck mode);

}  // namespace keel

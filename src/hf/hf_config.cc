#include "hf/hf_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <optional>
#include <vector>

namespace keel {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

// The float's shortest decimal form as a double (1e-5f -> 1e-05, not 9.999999747378752e-06).
double ShortestDouble(float v) {
  return std::stod(fmt::format("{}", v));
}

// Reads keys of config.json; the first failure is kept (InvalidArgument naming the file and key)
// and later reads return their fallbacks. Absent keys whose Hugging Face default is taken are
// collected for one note.
class ConfigReader {
 public:
  ConfigReader(const json& doc, std::string path) : doc_(doc), path_(std::move(path)) {}

  // The first of `names` present and not null; nullptr when none is. `used` gets its name.
  const json* Find(const std::vector<const char*>& names, std::string* used = nullptr) const {
    for (const char* n : names) {
      auto it = doc_.find(n);
      if (it != doc_.end() && !it->is_null()) {
        if (used) *used = n;
        return &*it;
      }
    }
    return nullptr;
  }
  bool Has(const char* name) const { return Find({name}) != nullptr; }

  // A required integer in [lo, hi], under any of its names.
  int Int(const std::vector<const char*>& names, int lo,
          int hi = std::numeric_limits<int32_t>::max()) {
    std::string used = *names.begin();
    const json* v = Find(names, &used);
    if (v == nullptr) {
      Fail(fmt::format("has no {}, which keel needs to build the model", Names(names)));
      return lo;
    }
    return CheckInt(used, *v, lo, hi);
  }
  // An optional integer in [lo, hi]; `fallback` (HF's default, noted) when absent.
  int OptInt(const char* name, int fallback, int lo, int hi, const std::string& default_text) {
    const json* v = Find({name});
    if (v == nullptr) {
      Defaulted(name, default_text);
      return fallback;
    }
    return CheckInt(name, *v, lo, hi);
  }
  double Number(const char* name, double fallback) {
    const json* v = Find({name});
    if (v == nullptr) {
      Defaulted(name, fmt::format("{}", fallback));
      return fallback;
    }
    if (!v->is_number() || !std::isfinite(v->get<double>())) {
      Fail(fmt::format("{} must be a number, but is {}", name, v->dump()));
      return fallback;
    }
    return v->get<double>();
  }
  bool Bool(const char* name, bool fallback) {
    const json* v = Find({name});
    if (v == nullptr) {
      Defaulted(name, fallback ? "true" : "false");
      return fallback;
    }
    if (!v->is_boolean()) {
      Fail(fmt::format("{} must be true or false, but is {}", name, v->dump()));
      return fallback;
    }
    return v->get<bool>();
  }
  std::string String(const char* name, const std::string& fallback) {
    const json* v = Find({name});
    if (v == nullptr) {
      Defaulted(name, fallback);
      return fallback;
    }
    if (!v->is_string()) {
      Fail(fmt::format("{} must be a string, but is {}", name, Describe(*v)));
      return fallback;
    }
    return v->get<std::string>();
  }
  // A token id, or -1 when absent or not a non-negative integer (token ids only name tokens).
  int32_t TokenId(const char* name) const {
    const json* v = Find({name});
    if (v == nullptr || !v->is_number_integer() || v->get<int64_t>() < 0 ||
        v->get<int64_t>() > std::numeric_limits<int32_t>::max())
      return -1;
    return static_cast<int32_t>(v->get<int64_t>());
  }

  // Refusal: what keel cannot compute (InvalidArgument; the first one wins).
  void Refuse(const std::string& what) { Fail(what); }
  void Fail(const std::string& what) {
    if (status_.ok()) status_ = Status::InvalidArgument(path_ + ": " + what);
  }
  const Status& status() const { return status_; }
  bool ok() const { return status_.ok(); }

  // One note naming every default taken (empty when none was).
  std::string DefaultsNote() const {
    if (defaults_.empty()) return "";
    std::string keys;
    for (const auto& [k, v] : defaults_) keys += (keys.empty() ? "" : ", ") + k + " " + v;
    return path_ + " leaves out keys whose Hugging Face defaults apply: " + keys;
  }
  static std::string Describe(const json& v) {
    std::string s = v.dump();
    return s.size() > 60 ? s.substr(0, 57) + "..." : s;
  }

 private:
  static std::string Names(const std::vector<const char*>& names) {
    std::string s;
    for (const char* n : names) s += (s.empty() ? "" : " (or ") + std::string(n);
    if (names.size() > 1) s += ")";
    return s;
  }
  int CheckInt(const std::string& name, const json& v, int lo, int hi) {
    if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi ||
        (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi))) {
      Fail(
          fmt::format("{} must be an integer from {} to {}, but is {}", name, lo, hi, Describe(v)));
      return lo;
    }
    return static_cast<int>(v.get<int64_t>());
  }
  void Defaulted(const std::string& name, const std::string& value) {
    defaults_.emplace_back(name, value);
  }

  const json& doc_;
  std::string path_;
  Status status_;
  std::vector<std::pair<std::string, std::string>> defaults_;
};

// GELU's tanh approximation under the names HF gives it (keel's Backend::GeluForward).
bool IsTanhGelu(const std::string& act) {
  return act == "gelu_new" || act == "gelu_pytorch_tanh" || act == "gelu_fast";
}

int ArchIndex(HfArch arch) {
  return arch == HfArch::kGpt2 ? 0 : arch == HfArch::kLlama ? 1 : 2;
}

// The sizes that are one integer of `arch`'s config.json (config/model_shape.h's table).
void ReadShapeInts(ConfigReader& r, HfArch arch, GptSpec* s) {
  for (const ShapeField& f : ShapeFields()) {
    const std::vector<const char*>& keys = f.hf_keys[ArchIndex(arch)];
    if (f.hf_member != nullptr && !keys.empty()) s->*f.hf_member = r.Int(keys, 1);
  }
}

// The key the field of the checkpoint key `json_key` is written as in `arch`'s config.json.
const char* HfKey(HfArch arch, const std::string& json_key) {
  for (const ShapeField& f : ShapeFields())
    if (f.json_key == json_key && !f.hf_keys[ArchIndex(arch)].empty())
      return f.hf_keys[ArchIndex(arch)][0];
  KEEL_CHECK(false, "no Hugging Face key in the shape table");
  return "";
}

void ReadGpt2(ConfigReader& r, const HfConfigOptions& options, HfModelConfig* out) {
  GptSpec& s = out->spec;
  ReadShapeInts(r, HfArch::kGpt2, &s);  // sizes, vocabulary, positions
  if (r.ok() && options.max_positions > 0 && options.max_positions != s.max_positions)
    r.Refuse(fmt::format(
        "GPT-2's positions are learned weights (n_positions {} rows): --max-position-embeddings "
        "cannot change them; leave it out",
        s.max_positions));
  s.ffn_hidden = r.Has("n_inner") ? r.Int({"n_inner"}, 1) : 4 * s.hidden;
  const std::string act = r.String("activation_function", "gelu_new");
  if (r.ok() && !IsTanhGelu(act))
    r.Refuse("activation_function '" + act +
             "' is not the tanh approximation of GELU (gelu_new, gelu_pytorch_tanh), the only "
             "activation keel computes for GPT-2");
  s.layernorm_eps = static_cast<float>(r.Number("layer_norm_epsilon", 1e-5));
  if (!r.Bool("scale_attn_weights", true))
    r.Refuse(
        "scale_attn_weights is false: keel always scales attention scores by 1/sqrt(head_dim)");
  if (r.Bool("scale_attn_by_inverse_layer_idx", false))
    r.Refuse("scale_attn_by_inverse_layer_idx is true: keel does not scale attention by layer");
  if (r.Find({"add_cross_attention"}) != nullptr && r.Bool("add_cross_attention", false))
    r.Refuse("add_cross_attention is true: keel's model is decoder-only, without cross-attention");
  s.untie_embeddings = !r.Bool("tie_word_embeddings", true);
}

// RoPE scaling, from config.json's rope_scaling or the scaling keys of transformers 5's
// rope_parameters (`where` names which): Llama 3.x's "llama3" and "linear" interpolation, the
// kinds keel computes; any other kind or key is refused by name.
void ReadRopeScaling(ConfigReader& r, const json& scaling, const std::string& where, GptSpec* s) {
  if (!scaling.is_object())
    return r.Fail(where + " must be an object, but is " + ConfigReader::Describe(scaling));
  std::string type;
  for (const char* key : {"rope_type", "type"}) {  // "type" is the older spelling
    auto it = scaling.find(key);
    if (it == scaling.end()) continue;
    if (!it->is_string() || (!type.empty() && type != it->get<std::string>()))
      return r.Fail(where + "." + key + " " + ConfigReader::Describe(*it) +
                    " is not a name, or differs from the other spelling of the type");
    type = it->get<std::string>();
  }
  if (type == "default" || type.empty()) {
    if (scaling.size() > (scaling.contains("rope_type") ? 1u : 0u) + scaling.contains("type"))
      return r.Refuse(where + " " + ConfigReader::Describe(scaling) +
                      ": settings without a rope_type, or for the default (unscaled) RoPE");
    return;
  }
  if (type != "llama3" && type != "linear")
    return r.Refuse(where + " type '" + type +
                    "': keel's RoPE scales as Llama 3.x (llama3) or by linear interpolation "
                    "(linear) only; keel cannot represent this model");
  // Each key once, a finite number; what HF checks of it, checked here.
  auto number = [&](const char* key) -> std::optional<double> {
    auto it = scaling.find(key);
    if (it == scaling.end() || !it->is_number() || !std::isfinite(it->get<double>())) {
      r.Fail(fmt::format("{}.{} must be a number for rope type {}, but is {}", where, key, type,
                         it == scaling.end() ? "absent" : ConfigReader::Describe(*it)));
      return std::nullopt;
    }
    return it->get<double>();
  };
  const std::vector<std::string> known =
      type == "linear"
          ? std::vector<std::string>{"rope_type", "type", "factor"}
          : std::vector<std::string>{"rope_type",        "type",
                                     "factor",           "low_freq_factor",
                                     "high_freq_factor", "original_max_position_embeddings"};
  for (const auto& [key, value] : scaling.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end())
      return r.Refuse(where + "." + key + " " + ConfigReader::Describe(value) + ": keel's " + type +
                      " RoPE scaling has no such setting");
  }
  const std::optional<double> factor = number("factor");
  if (!factor) return;
  if (!(*factor >= 1))
    return r.Fail(fmt::format("{}.factor {} must be at least 1", where, *factor));
  if (type == "linear") {
    if (*factor != std::floor(*factor) || *factor > std::numeric_limits<int32_t>::max())
      return r.Refuse(fmt::format(
          "{}.factor {}: keel's linear interpolation (--rotary-seq-len-interpolation-factor, "
          "Megatron-LM's) takes a whole factor",
          where, *factor));
    s->rope_interpolation_factor = static_cast<int>(*factor);
    return;
  }
  const std::optional<double> low = number("low_freq_factor");
  const std::optional<double> high = number("high_freq_factor");
  const std::optional<double> original = number("original_max_position_embeddings");
  if (!low || !high || !original) return;
  if (!(*low > 0 && *high > *low))
    return r.Fail(fmt::format("{}: low_freq_factor {} and high_freq_factor {} need 0 < low < high",
                              where, *low, *high));
  if (!(*original >= 1 && *original <= std::numeric_limits<int32_t>::max() &&
        *original == std::floor(*original)))
    return r.Fail(fmt::format("{}.original_max_position_embeddings {} must be a positive integer",
                              where, *original));
  s->rope_llama3 = true;
  s->rope_llama3_factor = *factor;
  s->rope_low_freq_factor = *low;
  s->rope_high_freq_factor = *high;
  s->rope_original_max_positions = static_cast<int>(*original);
}

void ReadLlama(ConfigReader& r, const HfConfigOptions& options, HfModelConfig* out) {
  GptSpec& s = out->spec;
  s.rope = true;
  s.rmsnorm = true;
  s.swiglu = true;
  ReadShapeInts(r, HfArch::kLlama, &s);  // sizes, vocabulary, positions
  if (options.max_positions > 0) {
    out->notes.push_back(fmt::format(
        "max positions {} from --max-position-embeddings (config.json: max_position_embeddings "
        "{}); RoPE has no position weights, so only keel's sequence limit changes",
        options.max_positions, s.max_positions));
    s.max_positions = options.max_positions;
  }
  const int kv = r.OptInt("num_key_value_heads", s.heads, 1, std::numeric_limits<int32_t>::max(),
                          fmt::format("(= num_attention_heads {})", s.heads));
  if (!r.ok()) return;
  if (s.hidden % s.heads != 0)
    return r.Refuse(fmt::format("hidden_size {} is not a multiple of num_attention_heads {}",
                                s.hidden, s.heads));
  if (kv > s.heads || s.heads % kv != 0)
    return r.Refuse(fmt::format(
        "num_key_value_heads {} does not divide num_attention_heads {} into equal groups", kv,
        s.heads));
  s.SetKvHeads(kv == s.heads ? 0 : kv);
  if (r.Has("head_dim")) {
    const int head_dim = r.Int({"head_dim"}, 1);
    if (r.ok() && head_dim != s.hidden / s.heads)
      return r.Refuse(fmt::format(
          "head_dim {} differs from hidden_size / num_attention_heads = {}: keel's heads are "
          "hidden / heads wide",
          head_dim, s.hidden / s.heads));
  }
  const std::string act = r.String("hidden_act", "silu");
  if (act != "silu" && act != "swish")
    return r.Refuse("hidden_act '" + act +
                    "' is not silu, the gate activation of keel's SwiGLU (--swiglu)");
  s.layernorm_eps = static_cast<float>(r.Number("rms_norm_eps", 1e-6));
  // RoPE: the rotate-half scheme with an integer base (--rotary-base is an integer), unscaled or
  // scaled as Llama 3.x or linearly.
  const json* rope_scaling = r.Find({"rope_scaling"});
  if (rope_scaling != nullptr) ReadRopeScaling(r, *rope_scaling, "rope_scaling", &s);
  std::optional<double> params_theta;
  if (const json* params = r.Find({"rope_parameters"}); params != nullptr) {
    // transformers 5 keeps RoPE's settings in one object: its base and its scaling.
    if (!params->is_object())
      return r.Fail("rope_parameters must be an object, but is " + ConfigReader::Describe(*params));
    json scaling = json::object();
    for (const auto& [key, value] : params->items()) {
      if (key == "rope_theta" || key == "partial_rotary_factor") continue;
      scaling[key] = value;
    }
    if (rope_scaling != nullptr && !scaling.empty() && scaling != *rope_scaling)
      return r.Refuse("rope_scaling and rope_parameters scale RoPE differently");
    if (rope_scaling == nullptr) ReadRopeScaling(r, scaling, "rope_parameters", &s);
    for (const auto& [key, value] : params->items()) {
      if (key == "rope_theta") {
        if (!value.is_number())
          return r.Fail("rope_parameters.rope_theta must be a number, but is " +
                        ConfigReader::Describe(value));
        params_theta = value.get<double>();
      } else if (key == "partial_rotary_factor") {
        if (!value.is_number() || value.get<double>() != 1.0)
          return r.Refuse("rope_parameters.partial_rotary_factor " + ConfigReader::Describe(value) +
                          ": Llama export and import rotate every dimension of each head");
      }  // the scaling keys were read above
    }
  }
  double theta = 10000;
  if (r.Has("rope_theta")) {
    theta = r.Number("rope_theta", theta);
    if (params_theta && *params_theta != theta)
      return r.Refuse("rope_theta and rope_parameters.rope_theta differ");
  } else if (params_theta) {
    theta = *params_theta;
  } else {
    theta = r.Number("rope_theta", theta);  // HF's default, noted
  }
  if (!r.ok()) return;
  if (!(theta >= 1 && theta <= std::numeric_limits<int32_t>::max() && theta == std::floor(theta)))
    return r.Refuse(fmt::format(
        "rope_theta {} is not an integer from 1 to 2147483647, which keel's --rotary-base takes",
        theta));
  s.rotary_base = static_cast<int>(theta);
  if (const json* f = r.Find({"partial_rotary_factor"});
      f != nullptr && (!f->is_number() || f->get<double>() != 1.0))
    return r.Refuse("partial_rotary_factor " + f->dump() +
                    ": Llama export and import rotate every dimension of each head");
  for (const char* key : {"sliding_window", "use_sliding_window"}) {
    const json* v = r.Find({key});
    if (v != nullptr && !(v->is_boolean() && !v->get<bool>()))
      return r.Refuse(std::string(key) + " " + v->dump() +
                      ": keel's attention is over the whole causal context, without a sliding "
                      "window");
  }
  const bool attention_bias = r.Bool("attention_bias", false);
  const bool mlp_bias = r.Bool("mlp_bias", false);
  if (r.ok() && attention_bias != mlp_bias)
    return r.Refuse(fmt::format(
        "attention_bias is {} but mlp_bias is {}: keel's linear layers all have biases or none "
        "(--disable-bias-linear)",
        attention_bias, mlp_bias));
  s.bias = attention_bias;
  s.untie_embeddings = !r.Bool("tie_word_embeddings", false);
  if (const json* tp = r.Find({"pretraining_tp"});
      tp != nullptr && tp->is_number_integer() && tp->get<int64_t>() > 1)
    out->notes.push_back(fmt::format(
        "pretraining_tp {} is ignored: Hugging Face computes the same products in slices",
        tp->dump()));
}

void ReadBloom(ConfigReader& r, const HfConfigOptions& options, HfModelConfig* out) {
  GptSpec& s = out->spec;
  s.alibi = true;
  s.embed_layernorm = true;
  ReadShapeInts(r, HfArch::kBloom, &s);  // sizes and vocabulary (positions: below)
  if (!r.ok()) return;
  s.ffn_hidden = 4 * s.hidden;
  if (const json* inner = r.Find({"n_inner"}); inner != nullptr && *inner != json(4 * s.hidden))
    return r.Refuse("n_inner " + inner->dump() +
                    " is not 4 x hidden_size: Hugging Face BLOOM's MLP "
                    "is always 4h (it ignores n_inner), so this folder is inconsistent");
  s.layernorm_eps = static_cast<float>(r.Number("layer_norm_epsilon", 1e-5));
  if (r.Bool("apply_residual_connection_post_layernorm", false))
    return r.Refuse(
        "apply_residual_connection_post_layernorm is true: keel's residual is the block's input, "
        "not its LayerNorm");
  if (!r.Bool("tie_word_embeddings", true))
    return r.Refuse(
        "tie_word_embeddings is false: keel exports and imports BLOOM with its output layer tied "
        "to the word embedding");
  // ALiBi has no position weights: keel's limit is a choice, said as a note.
  if (options.max_positions > 0) {
    s.max_positions = options.max_positions;
    out->notes.push_back(
        fmt::format("max positions {} (--max-position-embeddings)", s.max_positions));
  } else if (r.Has("seq_length")) {
    s.max_positions = r.Int({"seq_length"}, 1);
    out->notes.push_back(fmt::format(
        "max positions {} from config.json's seq_length (BLOOM's ALiBi has no position limit; "
        "--max-position-embeddings N chooses another)",
        s.max_positions));
  } else {
    s.max_positions = 2048;
    out->notes.push_back(
        "max positions 2048, BLOOM's training length: config.json has no seq_length and ALiBi "
        "has no position limit (--max-position-embeddings N chooses another)");
  }
}

}  // namespace

ojson HfConfigJson(HfArch arch, const GptSpec& spec, int32_t eod_id) {
  ojson c;
  c["model_type"] = HfModelType(arch);
  c["architectures"] = {HfModelClass(arch)};
  c[HfKey(arch, "vocab")] = spec.vocab;  // the real vocabulary: keel's padding rows are dropped
  switch (arch) {
    case HfArch::kGpt2:
      c[HfKey(arch, "max_positions")] = spec.max_positions;
      c["n_ctx"] = spec.max_positions;
      c[HfKey(arch, "hidden")] = spec.hidden;
      c[HfKey(arch, "num_layers")] = spec.num_layers;
      c[HfKey(arch, "heads")] = spec.heads;
      // HF reads null as 4 * n_embd.
      c["n_inner"] = spec.ffn_hidden == 4 * spec.hidden ? ojson(nullptr) : ojson(spec.ffn_hidden);
      // Backend::GeluForward is the tanh approximation, which HF calls gelu_new ("gelu" is erf).
      c["activation_function"] = "gelu_new";
      c["layer_norm_epsilon"] = ShortestDouble(spec.layernorm_eps);
      c["resid_pdrop"] = 0.0;  // keel has no dropout
      c["embd_pdrop"] = 0.0;
      c["attn_pdrop"] = 0.0;
      c["initializer_range"] = 0.02;
      c["scale_attn_weights"] = true;  // keel pre-scales Q and K by hs^-1/4 each: / sqrt(hs)
      c["scale_attn_by_inverse_layer_idx"] = false;
      c["reorder_and_upcast_attn"] = false;
      break;
    case HfArch::kLlama:
      c[HfKey(arch, "hidden")] = spec.hidden;
      c[HfKey(arch, "ffn_hidden")] = spec.ffn_hidden;
      c[HfKey(arch, "num_layers")] = spec.num_layers;
      c[HfKey(arch, "heads")] = spec.heads;
      c["num_key_value_heads"] = spec.KvHeads();
      c["head_dim"] = spec.HeadDim();
      c["hidden_act"] = "silu";  // SwiGLU's gate
      c[HfKey(arch, "max_positions")] = spec.max_positions;
      c["rms_norm_eps"] = ShortestDouble(spec.layernorm_eps);
      c["rope_theta"] = static_cast<double>(spec.rotary_base);  // as HF writes it: 10000.0
      if (spec.RopeLlama3()) {
        c["rope_scaling"] = {
            {"rope_type", "llama3"},
            {"factor", spec.rope_llama3_factor},
            {"low_freq_factor", spec.rope_low_freq_factor},
            {"high_freq_factor", spec.rope_high_freq_factor},
            {"original_max_position_embeddings", spec.rope_original_max_positions}};
      } else if (spec.RopeLinearFactor() != 1) {
        c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", spec.RopeLinearFactor()}};
      } else {
        c["rope_scaling"] = nullptr;
      }
      c["attention_bias"] = spec.bias;  // keel's bias switch covers every linear layer
      c["mlp_bias"] = spec.bias;
      c["attention_dropout"] = 0.0;
      c["initializer_range"] = 0.02;
      c["pretraining_tp"] = 1;
      break;
    case HfArch::kBloom:
      c[HfKey(arch, "hidden")] = spec.hidden;
      c[HfKey(arch, "num_layers")] = spec.num_layers;
      c[HfKey(arch, "heads")] = spec.heads;
      c["layer_norm_epsilon"] = ShortestDouble(spec.layernorm_eps);
      c["apply_residual_connection_post_layernorm"] = false;
      c["hidden_dropout"] = 0.0;
      c["attention_dropout"] = 0.0;
      c["initializer_range"] = 0.02;
      c["pretraining_tp"] = 1;
      c["slow_but_exact"] = false;
      // ALiBi has no position limit; keel's (--max-position-embeddings) is kept for an import.
      c["seq_length"] = spec.max_positions;
      break;
  }
  c["bos_token_id"] = eod_id;
  c["eos_token_id"] = eod_id;
  c["tie_word_embeddings"] = !spec.untie_embeddings;
  c["use_cache"] = true;
  c["torch_dtype"] = "float32";
  return c;
}

Status ParseHfConfig(const std::string& text, const std::string& path,
                     const HfConfigOptions& options, HfModelConfig* out) {
  *out = HfModelConfig();
  const json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object())
    return Status::Corruption(path + " is not a JSON object (a Hugging Face config.json)");
  ConfigReader r(doc, path);
  const json* type = r.Find({"model_type"});
  if (type == nullptr || !type->is_string())
    return Status::InvalidArgument(
        path + " has no model_type string; keel imports model_type gpt2, llama and bloom");
  const std::string model_type = type->get<std::string>();
  if (model_type == "gpt2") {
    out->arch = HfArch::kGpt2;
  } else if (model_type == "llama") {
    out->arch = HfArch::kLlama;
  } else if (model_type == "bloom") {
    out->arch = HfArch::kBloom;
  } else {
    return Status::InvalidArgument(path + ": model_type '" + model_type +
                                   "' is not one keel imports (gpt2, llama, bloom)");
  }
  // A head of another task (sequence classification, ...) has other weights than the LM head.
  if (const json* archs = r.Find({"architectures"}); archs != nullptr) {
    bool found = false;
    for (const json& a : archs->is_array() ? *archs : json::array())
      found = found || (a.is_string() && a.get<std::string>() == HfModelClass(out->arch));
    if (!found)
      return Status::InvalidArgument(fmt::format(
          "{}: architectures {} does not list {}: keel imports the causal language model only",
          path, ConfigReader::Describe(*archs), HfModelClass(out->arch)));
  }
  switch (out->arch) {
    case HfArch::kGpt2:
      ReadGpt2(r, options, out);
      break;
    case HfArch::kLlama:
      ReadLlama(r, options, out);
      break;
    case HfArch::kBloom:
      ReadBloom(r, options, out);
      break;
  }
  KEEL_RETURN_IF_ERROR(r.status());
  GptSpec& s = out->spec;
  if (s.hidden % s.heads != 0)
    return Status::InvalidArgument(
        fmt::format("{}: the hidden size {} is not a multiple of the {} attention heads", path,
                    s.hidden, s.heads));
  if (!(s.layernorm_eps > 0))
    return Status::InvalidArgument(
        fmt::format("{}: the norm epsilon {} must be positive", path, s.layernorm_eps));
  out->bos_token_id = r.TokenId("bos_token_id");
  out->eos_token_id = r.TokenId("eos_token_id");
  if (const std::string d = r.DefaultsNote(); !d.empty()) out->notes.insert(out->notes.begin(), d);
  // The architecture that keel would export this model as must be this one (the spec is built
  // from its own keys, so only a limit of keel's can fail here).
  HfArch check;
  KEEL_RETURN_IF_ERROR(HfArchForSpec(s, &check));
  return Status::OK();
}

}  // namespace keel

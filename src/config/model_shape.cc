// The table of the model's shape fields (config/model_shape.h): per field its setting, its key in
// a checkpoint's `model` object with the value of checkpoints that lack it, and its limits. The
// limit messages are the config's (a checkpoint's reader puts them in its own message).
#include "config/model_shape.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/json_reader.h"

namespace keel {
namespace {

using json = nlohmann::json;

// Sizes the model and its kernels compute with in int (config_internal.h's kMaxInt).
constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();

Status Invalid(std::string msg) {
  return Status::InvalidArgument(std::move(msg));
}

Status Positive(const char* flag, int64_t v) {
  if (v > 0) return Status::OK();
  return Invalid(fmt::format("--{} {} must be positive; set --{} to 1 or more", flag, v, flag));
}

// A size of 0 that Validate resolves (kGiven), or a positive one.
Status SizeOrDefault(const char* flag, int64_t v, ShapeCheck mode, const char* zero_fix) {
  if (mode == ShapeCheck::kResolved) return Positive(flag, v);
  if (v >= 0) return Status::OK();
  return Invalid(fmt::format("--{} {} must not be negative; {}", flag, v, zero_fix));
}

// A field read and written as it is (required: checkpoints always had it; else `fallback` is the
// value of checkpoints written before it existed).
template <typename T, typename JsonT = T>
ShapeField Plain(std::string setting, std::string key, T GptSpec::*m, bool required,
                 T fallback = T{}) {
  ShapeField f;
  f.setting = std::move(setting);
  f.json_key = key;
  f.to_json = [m, key](const GptSpec& s, json* j) { (*j)[key] = static_cast<JsonT>(s.*m); };
  f.from_json = [m, key, required, fallback](const JsonValue& v, GptSpec* s) {
    s->*m = static_cast<T>(required ? v[key].Get<JsonT>()
                                    : v.Optional(key).Get<JsonT>(static_cast<JsonT>(fallback)));
  };
  return f;
}

template <typename T, typename JsonT = T>
ShapeField Plain(std::string setting, std::string key, T GptSpec::*m, bool required, T fallback,
                 std::function<Status(const GptSpec&, ShapeCheck)> check) {
  ShapeField f = Plain<T, JsonT>(std::move(setting), std::move(key), m, required, fallback);
  f.check = std::move(check);
  return f;
}

// A setting whose value a parent row writes (the Llama 3 scaling's band edges, the key/value
// group count): only its limits live here.
ShapeField Limits(std::string setting, std::function<Status(const GptSpec&, ShapeCheck)> check) {
  ShapeField f;
  f.setting = std::move(setting);
  f.check = std::move(check);
  return f;
}

// RoPE's scaling settings are checked where the model applies them (a config keeps them, ignored,
// without RoPE: a note of Validate's), and wherever a checkpoint holds them (keel writes them only
// with RoPE, so there they were edited by hand).
bool ScalingApplies(const GptSpec& s, ShapeCheck mode) {
  return s.rope || mode == ShapeCheck::kResolved;
}
bool Llama3Applies(const GptSpec& s, ShapeCheck mode) {
  return s.rope_llama3 && ScalingApplies(s, mode);
}

// A double of a checkpoint that keel keeps as a whole number (it wrote it from an int setting):
// the number, or `bad` for a fraction or one out of int range (refused by the field's limits).
int WholeOr(double v, int bad) {
  if (!(v == std::floor(v)) || v < std::numeric_limits<int>::min() ||
      v > std::numeric_limits<int>::max())
    return bad;
  return static_cast<int>(v);
}

// The row's Hugging Face keys per architecture (GPT-2, Llama, BLOOM; see ShapeField::hf_keys).
ShapeField Hf(ShapeField f, int GptSpec::*m, std::vector<const char*> gpt2,
              std::vector<const char*> llama, std::vector<const char*> bloom) {
  f.hf_member = m;
  f.hf_keys[0] = std::move(gpt2);
  f.hf_keys[1] = std::move(llama);
  f.hf_keys[2] = std::move(bloom);
  return f;
}

std::vector<ShapeField> MakeTable() {
  std::vector<ShapeField> t;
  t.push_back(
      Hf(Plain<int>("num-layers", "num_layers", &GptSpec::num_layers, true, 0,
                    [](const GptSpec& s, ShapeCheck) {
                      KEEL_RETURN_IF_ERROR(Positive("num-layers", s.num_layers));
                      if (s.num_layers <= kMaxInt - 1) return Status::OK();
                      return Invalid(fmt::format(
                          "--num-layers {} is more than {}: the model counts its num-layers "
                          "+ 1 residual streams in 32-bit integers; use fewer layers",
                          s.num_layers, kMaxInt - 1));
                    }),
         &GptSpec::num_layers, {"n_layer", "num_hidden_layers"}, {"num_hidden_layers"},
         {"n_layer", "num_hidden_layers"}));
  t.push_back(Hf(
      Plain<int>("hidden-size", "hidden", &GptSpec::hidden, true, 0,
                 [](const GptSpec& s, ShapeCheck) {
                   KEEL_RETURN_IF_ERROR(Positive("hidden-size", s.hidden));
                   if (s.hidden <= kMaxInt / 4) return Status::OK();
                   return Invalid(fmt::format(
                       "--hidden-size {} is more than {}: the model computes 4 x hidden-size (the "
                       "default MLP "
                       "width; the QKV width is 3 x hidden-size) in 32-bit integers; use a smaller "
                       "--hidden-size",
                       s.hidden, kMaxInt / 4));
                 }),
      &GptSpec::hidden, {"n_embd", "hidden_size"}, {"hidden_size"}, {"hidden_size", "n_embed"}));
  t.push_back(Hf(Plain<int>("num-attention-heads", "heads", &GptSpec::heads, true, 0,
                            [](const GptSpec& s, ShapeCheck) {
                              KEEL_RETURN_IF_ERROR(Positive("num-attention-heads", s.heads));
                              if (s.hidden % s.heads == 0) return Status::OK();
                              const int h = s.hidden, n = s.heads;
                              // A head dimension that is a multiple of 8, a power-of-two head
                              // count.
                              const int64_t step = int64_t{n} * 8;
                              const int64_t try_hidden =
                                  std::max<int64_t>(step, (h + step / 2) / step * step);
                              int try_heads = 1;
                              while (try_heads * 2 <= n && h % (try_heads * 2) == 0) try_heads *= 2;
                              return Invalid(fmt::format(
                                  "--hidden-size {} is not divisible by --num-attention-heads {}: "
                                  "hidden size must be a multiple of the head count; try "
                                  "--hidden-size {} or --num-attention-heads {}",
                                  h, n, try_hidden, try_heads));
                            }),
                 &GptSpec::heads, {"n_head", "num_attention_heads"}, {"num_attention_heads"},
                 {"n_head", "num_attention_heads"}));
  t.push_back(Hf(Plain<int>("ffn-hidden-size", "ffn_hidden", &GptSpec::ffn_hidden, true, 0,
                            [](const GptSpec& s, ShapeCheck mode) {
                              return SizeOrDefault(
                                  "ffn-hidden-size", s.ffn_hidden, mode,
                                  "set it to 0 for 4 * hidden-size, or give a positive size");
                            }),
                 &GptSpec::ffn_hidden, {}, {"intermediate_size"}, {}));
  t.push_back(
      Hf(Plain<int>("max-position-embeddings", "max_positions", &GptSpec::max_positions, true, 0,
                    [](const GptSpec& s, ShapeCheck mode) {
                      return SizeOrDefault("max-position-embeddings", s.max_positions, mode,
                                           "set it to 0 to use --seq-length");
                    }),
         &GptSpec::max_positions, {"n_positions", "max_position_embeddings"},
         {"max_position_embeddings"}, {}));
  t.push_back(
      Hf(Plain<int>("", "vocab", &GptSpec::vocab, true, 0,
                    [](const GptSpec& s, ShapeCheck mode) {
                      if (s.vocab < 0 || (mode == ShapeCheck::kResolved && s.vocab == 0))
                        return Invalid(fmt::format(
                            "vocabulary size {} is {}: the dataset metadata is wrong; rebuild it",
                            s.vocab, s.vocab < 0 ? "negative" : "zero"));
                      return Status::OK();
                    }),
         &GptSpec::vocab, {"vocab_size"}, {"vocab_size"}, {"vocab_size"}));
  t.push_back(Plain<int>(
      "", "padded_vocab", &GptSpec::padded_vocab, true, 0, [](const GptSpec& s, ShapeCheck mode) {
        if (mode == ShapeCheck::kGiven || s.padded_vocab >= s.vocab) return Status::OK();
        return Invalid(fmt::format("the padded vocabulary {} is smaller than the vocabulary {}",
                                   s.padded_vocab, s.vocab));
      }));
  // --position-embedding-type is two flags of the file: alibi (always there) and rope (later).
  t.push_back(Plain<bool>("position-embedding-type", "alibi", &GptSpec::alibi, true, false,
                          [](const GptSpec& s, ShapeCheck) {
                            if (!(s.alibi && s.rope)) return Status::OK();
                            return Invalid(
                                "--position-embedding-type is both alibi and rope; choose one");
                          }));
  t.push_back(Plain<bool>("position-embedding-type", "rope", &GptSpec::rope, false, false));
  t.push_back(Plain<bool>("embed-layernorm", "embed_layernorm", &GptSpec::embed_layernorm, true));
  t.push_back(
      Plain<float>("layernorm-epsilon", "layernorm_eps", &GptSpec::layernorm_eps, true, 0.0f,
                   [](const GptSpec& s, ShapeCheck) {
                     if (s.layernorm_eps > 0) return Status::OK();
                     return Invalid(fmt::format(
                         "--layernorm-epsilon {} must be positive; try --layernorm-epsilon 1e-5",
                         s.layernorm_eps));
                   }));
  t.push_back(Plain<bool>("qk-layernorm", "qk_layernorm", &GptSpec::qk_layernorm, false, false));
  {
    // Only where it differs from layernorm_eps, which checkpoints without it used.
    ShapeField f = Plain<float>("qk-layernorm-epsilon", "qk_layernorm_eps",
                                &GptSpec::qk_layernorm_eps, false, 0.0f);
    f.to_json = [](const GptSpec& s, json* j) {
      if (s.qk_layernorm && s.QkLayerNormEps() != s.layernorm_eps)
        (*j)["qk_layernorm_eps"] = s.qk_layernorm_eps;
    };
    f.check = [](const GptSpec& s, ShapeCheck) {
      if (!(s.qk_layernorm_eps >= 0))
        return Invalid(fmt::format(
            "--qk-layernorm-epsilon {} must not be negative; use 0 for --layernorm-epsilon's, or "
            "a positive epsilon, e.g. --qk-layernorm-epsilon 1e-6",
            s.qk_layernorm_eps));
      if (s.qk_layernorm_eps == 0 || s.qk_layernorm) return Status::OK();
      return Invalid(
          fmt::format("--qk-layernorm-epsilon {} is the epsilon of QK-LayerNorm, which is off: add "
                      "--qk-layernorm, or drop --qk-layernorm-epsilon",
                      s.qk_layernorm_eps));
    };
    t.push_back(std::move(f));
  }
  {
    // A double setting kept as the fp32 the model computes with (the files always held that).
    ShapeField f = Plain<double, float>("z-loss", "z_loss", &GptSpec::z_loss, false, 0.0);
    f.resumable = true;
    t.push_back(std::move(f));
  }
  for (auto [setting, key, m] :
       {std::tuple{"reset-position-ids", "reset_position_ids", &GptSpec::reset_position_ids},
        std::tuple{"reset-attention-mask", "reset_attention_mask",
                   &GptSpec::reset_attention_mask}}) {
    ShapeField f = Plain<bool>(setting, key, m, false, false);
    f.resumable = true;
    t.push_back(std::move(f));
  }
  t.push_back(Plain<int32_t>("", "eod_id", &GptSpec::eod_id, false, -1));
  {
    // A double in the file (an int setting): a fraction there was edited by hand.
    ShapeField f;
    f.setting = "rotary-base";
    f.json_key = "rotary_base";
    f.to_json = [](const GptSpec& s, json* j) {
      (*j)["rotary_base"] = static_cast<double>(s.rotary_base);
    };
    f.from_json = [](const JsonValue& v, GptSpec* s) {
      s->rotary_base = WholeOr(v.Optional("rotary_base").Get<double>(10000.0), 0);
    };
    f.check = [](const GptSpec& s, ShapeCheck) {
      if (!s.rope || s.rotary_base >= 1) return Status::OK();
      return Invalid(fmt::format("--rotary-base {} must be at least 1; try --rotary-base 10000",
                                 s.rotary_base));
    };
    t.push_back(std::move(f));
  }
  {
    ShapeField f;
    f.setting = "rotary-percent";
    f.json_key = "rotary_percent";
    f.to_json = [](const GptSpec& s, json* j) { (*j)["rotary_percent"] = s.rotary_percent; };
    f.from_json = [](const JsonValue& v, GptSpec* s) {
      s->rotary_percent = v.Optional("rotary_percent").Get<double>(1.0);
    };
    f.check = [](const GptSpec& s, ShapeCheck) {
      if (!s.rope) return Status::OK();
      if (!(s.rotary_percent > 0 && s.rotary_percent <= 1)) {
        return Invalid(fmt::format(
            "--rotary-percent {} must be in (0, 1]: the share of each head's dimensions that "
            "turn; try --rotary-percent 1.0",
            s.rotary_percent));
      }
      const int rot = static_cast<int>(s.HeadDim() * s.rotary_percent);
      if (rot >= 2 && rot % 2 == 0) return Status::OK();
      return Invalid(fmt::format(
          "--rotary-percent {} of the head dimension {} gives {} rotary dimensions; RoPE turns "
          "them in pairs, so it needs an even number >= 2; try --rotary-percent 1.0",
          s.rotary_percent, s.HeadDim(), rot));
    };
    t.push_back(std::move(f));
  }
  {
    // Only where it is on, so that the files of unscaled models stay as they were.
    ShapeField f;
    f.setting = "rotary-seq-len-interpolation-factor";
    f.json_key = "rope_linear_factor";
    f.to_json = [](const GptSpec& s, json* j) {
      if (s.RopeLinearFactor() != 1) (*j)["rope_linear_factor"] = s.RopeLinearFactor();
    };
    f.from_json = [](const JsonValue& v, GptSpec* s) {
      const int factor = WholeOr(v.Optional("rope_linear_factor").Get<double>(1.0), -1);
      s->rope_interpolation_factor = factor == 1 ? 0 : factor < 1 ? -1 : factor;
    };
    f.check = [](const GptSpec& s, ShapeCheck mode) {
      if (!ScalingApplies(s, mode) || s.rope_interpolation_factor >= 0) return Status::OK();
      return Invalid(
          fmt::format("--rotary-seq-len-interpolation-factor {} must be at least 1 (or 0 for none)",
                      s.rope_interpolation_factor));
    };
    t.push_back(std::move(f));
  }
  {
    // Llama 3.x's scaling: one object, only where it is on; its four settings' limits follow.
    ShapeField f;
    f.setting = "use-rope-scaling";
    f.json_key = "rope_llama3";
    f.to_json = [](const GptSpec& s, json* j) {
      if (!s.RopeLlama3()) return;
      (*j)["rope_llama3"] = {{"factor", s.rope_llama3_factor},
                             {"low_freq_factor", s.rope_low_freq_factor},
                             {"high_freq_factor", s.rope_high_freq_factor},
                             {"original_max_positions", s.rope_original_max_positions}};
    };
    f.from_json = [](const JsonValue& v, GptSpec* s) {
      const JsonValue l3 = v.Optional("rope_llama3");
      if (!l3.present()) return;
      s->rope_llama3 = true;
      s->rope_llama3_factor = l3["factor"].Get<double>();
      s->rope_low_freq_factor = l3["low_freq_factor"].Get<double>();
      s->rope_high_freq_factor = l3["high_freq_factor"].Get<double>();
      s->rope_original_max_positions = l3["original_max_positions"].Get<int>();
    };
    f.check = [](const GptSpec& s, ShapeCheck mode) {
      // One scaling at a time (Hugging Face's rope_scaling holds one).
      if (!Llama3Applies(s, mode) || s.rope_interpolation_factor <= 1) return Status::OK();
      return Invalid(fmt::format(
          "--use-rope-scaling and --rotary-seq-len-interpolation-factor {} both scale RoPE; "
          "choose one (Llama 3.x checkpoints use --use-rope-scaling alone)",
          s.rope_interpolation_factor));
    };
    t.push_back(std::move(f));
  }
  t.push_back(Limits("rope-scaling-factor", [](const GptSpec& s, ShapeCheck mode) {
    if (!Llama3Applies(s, mode) || s.rope_llama3_factor >= 1) return Status::OK();
    return Invalid(fmt::format(
        "--rope-scaling-factor {} must be at least 1: it stretches the context the model was "
        "pretrained on; Llama 3.1 uses 8, Llama 3.2 32",
        s.rope_llama3_factor));
  }));
  t.push_back(Limits("rope-scaling-low-freq-factor", [](const GptSpec& s, ShapeCheck mode) {
    if (!Llama3Applies(s, mode) ||
        (s.rope_low_freq_factor > 0 && s.rope_high_freq_factor > s.rope_low_freq_factor))
      return Status::OK();
    return Invalid(fmt::format(
        "--rope-scaling-low-freq-factor {} and --rope-scaling-high-freq-factor {}: need 0 < low "
        "< high (Llama 3.x: 1 and 4)",
        s.rope_low_freq_factor, s.rope_high_freq_factor));
  }));
  t.push_back(Limits("rope-scaling-high-freq-factor", nullptr));  // checked with the low one
  t.push_back(Limits("rope-scaling-original-max-position-embeddings", [](const GptSpec& s,
                                                                         ShapeCheck mode) {
    if (!Llama3Applies(s, mode)) return Status::OK();
    return Positive("rope-scaling-original-max-position-embeddings", s.rope_original_max_positions);
  }));
  t.push_back(Plain<bool>("normalization", "rmsnorm", &GptSpec::rmsnorm, false, false));
  t.push_back(Plain<bool>(
      "swiglu", "swiglu", &GptSpec::swiglu, false, false, [](const GptSpec& s, ShapeCheck) {
        if (!s.swiglu || s.ffn_hidden <= kMaxInt / 2) return Status::OK();
        return Invalid(
            fmt::format("--ffn-hidden-size {} with --swiglu: the fused gate and up product "
                        "is 2 x ffn-hidden-size wide, more than a 32-bit integer; use a "
                        "smaller --ffn-hidden-size",
                        s.ffn_hidden));
      }));
  {
    // The file holds the key/value head count G, 0 for one per query head.
    ShapeField f;
    f.setting = "group-query-attention";
    f.json_key = "kv_heads";
    f.to_json = [](const GptSpec& s, json* j) {
      (*j)["kv_heads"] = s.group_query_attention ? s.num_query_groups : 0;
    };
    f.from_json = [](const JsonValue& v, GptSpec* s) {
      const int g = v.Optional("kv_heads").Get<int>(0);
      s->group_query_attention = g != 0;
      s->num_query_groups = g != 0 ? g : 1;
    };
    t.push_back(std::move(f));
  }
  t.push_back(Limits("num-query-groups", [](const GptSpec& s, ShapeCheck) {
    const int g = s.num_query_groups, n = s.heads;
    if (!s.group_query_attention || (g >= 1 && g <= n && n % g == 0)) return Status::OK();
    int fit = std::min(std::max(g, 1), n);
    while (n % fit != 0) --fit;
    return Invalid(fmt::format(
        "--num-query-groups {} must divide --num-attention-heads {} (each key/value head serves "
        "the same number of query heads); try --num-query-groups {}",
        g, n, fit));
  }));
  t.push_back(Plain<bool>("untie-embeddings-and-output-weights", "untie_embeddings",
                          &GptSpec::untie_embeddings, false, false));
  t.push_back(Plain<bool>("disable-bias-linear", "bias", &GptSpec::bias, false, true));
  return t;
}

}  // namespace

const std::vector<ShapeField>& ShapeFields() {
  static const std::vector<ShapeField>* table = new std::vector<ShapeField>(MakeTable());
  return *table;
}

json ShapeToJson(const GptSpec& spec) {
  json j = json::object();
  for (const ShapeField& f : ShapeFields())
    if (f.to_json) f.to_json(spec, &j);
  return j;
}

void ShapeFromJson(const JsonValue& model, GptSpec* spec) {
  GptSpec s;
  for (const ShapeField& f : ShapeFields())
    if (f.from_json) f.from_json(model, &s);
  *spec = s;
}

Status CheckShape(const GptSpec& spec, ShapeCheck mode) {
  for (const ShapeField& f : ShapeFields())
    if (f.check) KEEL_RETURN_IF_ERROR(f.check(spec, mode));
  return Status::OK();
}

}  // namespace keel

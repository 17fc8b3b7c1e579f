// Settings table, command line and TOML parsing, validation and formatting of TrainConfig.
// One table (Settings()) drives the CLI11 options, the TOML keys, the help text and FormatConfig,
// so the flag and file spellings can never drift apart.
#include "config/config.h"

#include <fmt/format.h>
#include <toml++/toml.h>
#include <xxhash.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <utility>
#include <vector>

#include "core/env.h"

namespace keel {
namespace {

std::string TomlString(const std::string& s);

// ---------------------------------------------------------------------------------------------
// A value from either source. CLI values arrive as text; TOML values as typed nodes. Setters ask
// for the type they need and report the key, the value and the expected type when it is not.

class Input {
 public:
  virtual ~Input() = default;
  // "--num-layers abc" or "run.toml:3: num-layers = \"abc\"", for error messages.
  virtual std::string Where() const = 0;
  // ", got a string" for typed sources; empty for text.
  virtual std::string Got() const { return ""; }
  virtual std::optional<int64_t> Int() const = 0;
  virtual std::optional<uint64_t> UInt() const = 0;
  virtual std::optional<double> Number() const = 0;
  virtual std::optional<bool> Bool() const = 0;
  virtual std::optional<std::string> String() const = 0;
  virtual std::optional<std::vector<int64_t>> IntList() const = 0;
  virtual std::optional<std::vector<std::string>> StringList() const = 0;
};

template <typename T>
std::optional<T> ParseWhole(std::string_view s) {
  T v{};
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, v);
  if (ec != std::errc() || p != end || s.empty()) return std::nullopt;
  return v;
}

class CliInput : public Input {
 public:
  CliInput(std::string flag, std::vector<std::string> values)
      : flag_(std::move(flag)), values_(std::move(values)) {}
  std::string Where() const override {
    std::string s = flag_;
    for (const auto& v : values_) s += " " + v;
    return s;
  }
  std::optional<int64_t> Int() const override {
    return values_.size() == 1 ? ParseWhole<int64_t>(values_[0]) : std::nullopt;
  }
  std::optional<uint64_t> UInt() const override {
    return values_.size() == 1 ? ParseWhole<uint64_t>(values_[0]) : std::nullopt;
  }
  std::optional<double> Number() const override {
    return values_.size() == 1 ? ParseWhole<double>(values_[0]) : std::nullopt;
  }
  std::optional<bool> Bool() const override {
    if (values_.size() != 1) return std::nullopt;
    const std::string& v = values_[0];
    if (v == "true" || v == "1" || v == "on" || v == "yes") return true;
    if (v == "false" || v == "0" || v == "off" || v == "no") return false;
    return std::nullopt;
  }
  std::optional<std::string> String() const override {
    return values_.size() == 1 ? std::optional<std::string>(values_[0]) : std::nullopt;
  }
  std::optional<std::vector<int64_t>> IntList() const override {
    std::vector<int64_t> out;
    for (const auto& v : values_) {
      auto x = ParseWhole<int64_t>(v);
      if (!x) return std::nullopt;
      out.push_back(*x);
    }
    return out;
  }
  std::optional<std::vector<std::string>> StringList() const override { return values_; }

 private:
  std::string flag_;
  std::vector<std::string> values_;
};

std::string TomlTypeName(toml::node_type t) {
  switch (t) {
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::table:
      return "a table";
    default:
      return "a date/time";
  }
}

class TomlInput : public Input {
 public:
  TomlInput(std::string origin, std::string key, const toml::node& node)
      : origin_(std::move(origin)), key_(std::move(key)), node_(node) {}
  std::string Where() const override {
    std::ostringstream value;
    if (auto str = node_.value_exact<std::string>()) {
      value << TomlString(*str);  // toml++ would print 'literal' quotes
    } else {
      node_.visit([&](const auto& v) { value << v; });
    }
    std::string where = origin_;
    if (node_.source().begin.line > 0) where += fmt::format(":{}", node_.source().begin.line);
    return fmt::format("{}: {} = {}", where, key_, value.str());
  }
  std::string Got() const override { return ", got " + TomlTypeName(node_.type()); }
  std::optional<int64_t> Int() const override { return node_.value_exact<int64_t>(); }
  std::optional<uint64_t> UInt() const override {
    auto v = node_.value_exact<int64_t>();
    if (!v || *v < 0) return std::nullopt;
    return static_cast<uint64_t>(*v);
  }
  std::optional<double> Number() const override {
    if (auto f = node_.as_floating_point()) return f->get();
    if (auto i = node_.as_integer()) return static_cast<double>(i->get());
    return std::nullopt;
  }
  std::optional<bool> Bool() const override { return node_.value_exact<bool>(); }
  std::optional<std::string> String() const override { return node_.value_exact<std::string>(); }
  std::optional<std::vector<int64_t>> IntList() const override {
    const toml::array* arr = node_.as_array();
    if (arr == nullptr) return std::nullopt;
    std::vector<int64_t> out;
    for (const toml::node& n : *arr) {
      auto x = n.value_exact<int64_t>();
      if (!x) return std::nullopt;
      out.push_back(*x);
    }
    return out;
  }
  std::optional<std::vector<std::string>> StringList() const override {
    if (auto str = node_.value_exact<std::string>()) return std::vector<std::string>{*str};
    const toml::array* arr = node_.as_array();
    if (arr == nullptr) return std::nullopt;
    std::vector<std::string> out;
    for (const toml::node& n : *arr) {
      // Numbers are taken as written (a mixture's weights: data-path = [0.7, "a", 0.3, "b"]).
      if (auto i = n.value_exact<int64_t>()) {
        out.push_back(std::to_string(*i));
      } else if (auto f = n.value_exact<double>()) {
        out.push_back(fmt::format("{}", *f));
      } else if (auto x = n.value_exact<std::string>()) {
        out.push_back(*x);
      } else {
        return std::nullopt;
      }
    }
    return out;
  }

 private:
  std::string origin_;
  std::string key_;
  const toml::node& node_;
};

Status TypeError(const Input& in, std::string_view expected) {
  return Status::InvalidArgument(fmt::format("{}: expected {}{}", in.Where(), expected, in.Got()));
}

// ---------------------------------------------------------------------------------------------
// Formatting of values as TOML literals (FormatConfig output is valid TOML with the same keys).

std::string TomlString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += fmt::format("\\u{:04X}", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

// Shortest round-trip text, always readable back as a TOML float (1 -> 1.0).
template <typename T>
std::string TomlFloat(T v) {
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

// ---------------------------------------------------------------------------------------------
// The settings table.

struct Setting {
  std::string name;  // flag without dashes, and TOML key
  std::string type;  // shown in --help, e.g. INT
  std::string help;
  bool is_flag = false;  // a bool: `--name` alone means true
  bool is_list = false;  // takes several values on the command line
  std::function<Status(const Input&, TrainConfig*)> set;
  std::function<std::string(const TrainConfig&)> get;  // TOML literal
};

template <typename T>
Setting IntSetting(std::string name, std::string help, T TrainConfig::*m) {
  Setting s;
  s.name = std::move(name);
  s.type = "INT";
  s.help = std::move(help);
  s.set = [m](const Input& in, TrainConfig* c) -> Status {
    if constexpr (std::is_unsigned_v<T>) {
      auto v = in.UInt();
      if (!v) return TypeError(in, "a non-negative integer");
      c->*m = static_cast<T>(*v);
    } else {
      auto v = in.Int();
      if (!v) return TypeError(in, "an integer");
      if (*v < std::numeric_limits<T>::min() || *v > std::numeric_limits<T>::max()) {
        return TypeError(in, fmt::format("an integer in [{}, {}]", std::numeric_limits<T>::min(),
                                         std::numeric_limits<T>::max()));
      }
      c->*m = static_cast<T>(*v);
    }
    return Status::OK();
  };
  s.get = [m](const TrainConfig& c) { return fmt::format("{}", c.*m); };
  return s;
}

template <typename T>
Setting RealSetting(std::string name, std::string help, T TrainConfig::*m) {
  Setting s;
  s.name = std::move(name);
  s.type = "FLOAT";
  s.help = std::move(help);
  s.set = [m](const Input& in, TrainConfig* c) -> Status {
    auto v = in.Number();
    if (!v || !std::isfinite(*v)) return TypeError(in, "a finite number");
    if (std::fabs(*v) > static_cast<double>(std::numeric_limits<T>::max())) {
      return TypeError(in, "a number in float range");
    }
    c->*m = static_cast<T>(*v);
    return Status::OK();
  };
  s.get = [m](const TrainConfig& c) { return TomlFloat(c.*m); };
  return s;
}

Setting BoolSetting(std::string name, std::string help, bool TrainConfig::*m) {
  Setting s;
  s.name = std::move(name);
  s.type = "";
  s.help = std::move(help);
  s.is_flag = true;
  s.set = [m](const Input& in, TrainConfig* c) -> Status {
    auto v = in.Bool();
    if (!v) return TypeError(in, "true or false");
    c->*m = *v;
    return Status::OK();
  };
  s.get = [m](const TrainConfig& c) -> std::string { return c.*m ? "true" : "false"; };
  return s;
}

Setting StringSetting(std::string name, std::string type, std::string help,
                      std::string TrainConfig::*m) {
  Setting s;
  s.name = std::move(name);
  s.type = std::move(type);
  s.help = std::move(help);
  s.set = [m](const Input& in, TrainConfig* c) -> Status {
    auto v = in.String();
    if (!v) return TypeError(in, "a string");
    c->*m = *v;
    return Status::OK();
  };
  s.get = [m](const TrainConfig& c) { return TomlString(c.*m); };
  return s;
}

template <typename E>
Setting EnumSetting(std::string name, std::string help, E TrainConfig::*m,
                    std::vector<std::pair<E, std::string>> names) {
  std::string choices;
  for (const auto& [e, n] : names) choices += (choices.empty() ? "" : ",") + n;
  Setting s;
  s.name = std::move(name);
  s.type = "{" + choices + "}";
  s.help = std::move(help);
  s.set = [m, names, choices](const Input& in, TrainConfig* c) -> Status {
    auto v = in.String();
    if (v) {
      for (const auto& [e, n] : names) {
        if (*v == n) {
          c->*m = e;
          return Status::OK();
        }
      }
    }
    return TypeError(in, "one of " + choices);
  };
  s.get = [m, names](const TrainConfig& c) {
    for (const auto& [e, n] : names) {
      if (c.*m == e) return TomlString(n);
    }
    return TomlString("?");
  };
  return s;
}

Setting IntListSetting(std::string name, std::string type, std::string help,
                       std::vector<int64_t> TrainConfig::*m) {
  Setting s;
  s.name = std::move(name);
  s.type = std::move(type);
  s.help = std::move(help);
  s.is_list = true;
  s.set = [m](const Input& in, TrainConfig* c) -> Status {
    auto v = in.IntList();
    if (!v) return TypeError(in, "a list of integers");
    c->*m = *v;
    return Status::OK();
  };
  s.get = [m](const TrainConfig& c) {
    std::string out = "[";
    for (size_t i = 0; i < (c.*m).size(); ++i) out += (i ? ", " : "") + std::to_string((c.*m)[i]);
    return out + "]";
  };
  return s;
}

Setting StringListSetting(std::string name, std::string type, std::string help,
                          std::vector<std::string> TrainConfig::*m) {
  Setting s;
  s.name = std::move(name);
  s.type = std::move(type);
  s.help = std::move(help);
  s.is_list = true;
  s.set = [m](const Input& in, TrainConfig* c) -> Status {
    auto v = in.StringList();
    if (!v) return TypeError(in, "a list of strings");
    // A lone empty string is no value (configs written before data-path became a list hold "").
    if (v->size() == 1 && (*v)[0].empty()) v->clear();
    c->*m = *v;
    return Status::OK();
  };
  s.get = [m](const TrainConfig& c) {
    std::string out = "[";
    for (size_t i = 0; i < (c.*m).size(); ++i) out += (i ? ", " : "") + TomlString((c.*m)[i]);
    return out + "]";
  };
  return s;
}

using TC = TrainConfig;

const std::vector<Setting>& Settings() {
  static const std::vector<Setting>* table = new std::vector<Setting>{
      // model
      IntSetting("num-layers", "number of transformer layers", &TC::num_layers),
      IntSetting("hidden-size", "transformer hidden size", &TC::hidden_size),
      IntSetting("ffn-hidden-size", "MLP inner size (0: 4 * hidden-size)", &TC::ffn_hidden_size),
      IntSetting("num-attention-heads", "attention heads; must divide hidden-size",
                 &TC::num_attention_heads),
      IntSetting("seq-length", "tokens per training sequence", &TC::seq_length),
      IntSetting("max-position-embeddings", "rows of the position table (0: seq-length)",
                 &TC::max_position_embeddings),
      EnumSetting("position-embedding-type", "position encoding", &TC::position_embedding_type,
                  {{PositionEmbedding::kLearnedAbsolute, "learned_absolute"},
                   {PositionEmbedding::kAlibi, "alibi"}}),
      BoolSetting("embed-layernorm", "LayerNorm after the word embedding (BLOOM)",
                  &TC::embed_layernorm),
      IntSetting("make-vocab-size-divisible-by", "pad the vocabulary to a multiple of this",
                 &TC::make_vocab_size_divisible_by),
      RealSetting("layernorm-epsilon", "LayerNorm epsilon", &TC::layernorm_epsilon),
      EnumSetting("init-method", "weight init: normal uses init-method-std", &TC::init_method,
                  {{InitMethod::kNormal, "normal"},
                   {InitMethod::kSmallInit, "small_init"},
                   {InitMethod::kMegatron530B, "megatron_530b"}}),
      RealSetting("init-method-std", "init standard deviation (init-method normal)",
                  &TC::init_method_std),
      BoolSetting("qk-layernorm",
                  "LayerNorm of each head's query and key before attention (stability at high LR)",
                  &TC::qk_layernorm),
      RealSetting("z-loss", "z-loss coefficient: adds z * mean (log Z)^2 to the objective (0: off)",
                  &TC::z_loss),
      // batch and length
      IntSetting("micro-batch-size", "sequences per micro-batch per rank", &TC::micro_batch_size),
      IntSetting("global-batch-size", "sequences per iteration (0: micro * data-parallel)",
                 &TC::global_batch_size),
      IntListSetting("rampup-batch-size", "START INCR SAMPLES",
                     "grow the global batch from START by INCR over SAMPLES samples",
                     &TC::rampup_batch_size),
      IntSetting("train-iters", "iterations to train (iteration-based run)", &TC::train_iters),
      IntSetting("train-samples", "samples to train (samples-based run)", &TC::train_samples),
      // learning rate
      RealSetting("lr", "peak learning rate", &TC::lr),
      RealSetting("min-lr", "learning rate at the end of decay", &TC::min_lr),
      EnumSetting("lr-decay-style", "learning rate decay", &TC::lr_decay_style,
                  {{LrDecayStyle::kConstant, "constant"},
                   {LrDecayStyle::kLinear, "linear"},
                   {LrDecayStyle::kCosine, "cosine"}}),
      IntSetting("lr-warmup-samples", "linear warmup length in samples", &TC::lr_warmup_samples),
      IntSetting("lr-warmup-iters", "linear warmup length in iterations", &TC::lr_warmup_iters),
      IntSetting("lr-decay-samples", "decay length in samples (0: train-samples)",
                 &TC::lr_decay_samples),
      IntSetting("lr-decay-iters", "decay length in iterations (0: train-iters)",
                 &TC::lr_decay_iters),
      // optimizer
      RealSetting("adam-beta1", "Adam beta1", &TC::adam_beta1),
      RealSetting("adam-beta2", "Adam beta2", &TC::adam_beta2),
      RealSetting("adam-eps", "Adam epsilon", &TC::adam_eps),
      RealSetting("weight-decay", "decoupled weight decay", &TC::weight_decay),
      RealSetting("clip-grad", "global gradient-norm clip (0: off)", &TC::clip_grad),
      // run
      IntSetting("seed", "random seed", &TC::seed),
      IntSetting("eval-interval", "iterations between evaluations", &TC::eval_interval),
      IntSetting("eval-iters", "iterations per evaluation", &TC::eval_iters),
      IntSetting("log-interval", "iterations between log lines", &TC::log_interval),
      IntSetting("threads", "CPU threads (0: all cores)", &TC::threads),
      // data
      StringListSetting("data-path", "[W] PREFIX ...",
                        "Megatron indexed dataset prefix, or a mixture W1 PREFIX1 W2 PREFIX2 ... "
                        "(empty: default corpus)",
                        &TC::data_path),
      StringSetting("split", "TRAIN,VALID,TEST", "document split weights", &TC::split),
      EnumSetting(
          "tokenizer", "tokenizer for the default corpus", &TC::tokenizer,
          {{TokenizerKind::kGpt2, "gpt2"}, {TokenizerKind::kSentencePiece, "sentencepiece"}}),
      BoolSetting("reset-position-ids", "restart position ids after each end-of-document token",
                  &TC::reset_position_ids),
      BoolSetting("reset-attention-mask",
                  "tokens attend only within their own document of a packed sequence",
                  &TC::reset_attention_mask),
      // checkpoints and stopping
      StringSetting("save", "DIR",
                    "run directory: checkpoints and the run's files; keel train with the same "
                    "--save resumes from its newest valid checkpoint",
                    &TC::save),
      StringSetting("load", "DIR",
                    "start from the newest valid checkpoint in DIR (default: --save's)", &TC::load),
      IntSetting("save-interval", "iterations between checkpoints (0: only at the end and on stop)",
                 &TC::save_interval),
      RealSetting("save-interval-minutes",
                  "also checkpoint when this many minutes passed since the last save (0: off)",
                  &TC::save_interval_minutes),
      IntSetting("keep-last-checkpoints",
                 "keep the newest N checkpoints, delete older unpinned ones (0: keep all)",
                 &TC::keep_last_checkpoints),
      StringSetting("kill-switch-path", "FILE", "when FILE appears: save a checkpoint and exit 0",
                    &TC::kill_switch_path),
      IntSetting("exit-interval", "save and exit when the iteration is a multiple of N (0: off)",
                 &TC::exit_interval),
      RealSetting("exit-duration-in-mins", "save and exit after this many minutes (0: off)",
                  &TC::exit_duration_in_mins),
      BoolSetting("override-scheduler",
                  "on resume, accept LR, warmup, decay, optimizer and batch settings that differ "
                  "from the checkpoint's",
                  &TC::override_scheduler),
      BoolSetting("override-data-order",
                  "on resume, accept a seed, data path or split that differs from the checkpoint's",
                  &TC::override_data_order),
      RealSetting("lr-scale-on-resume",
                  "on resume, multiply the schedule's LR by this from now on (stored in later "
                  "checkpoints; 0: keep the checkpoint's)",
                  &TC::lr_scale_on_resume),
      // guard
      EnumSetting("guard",
                  "instability guard: act (skip updates, roll back, cut the LR, reseed), observe "
                  "(journal what it would do), off",
                  &TC::guard,
                  {{GuardLevel::kOff, "off"},
                   {GuardLevel::kObserve, "observe"},
                   {GuardLevel::kAct, "act"}}),
      RealSetting("guard-z-threshold", "loss spike: robust z-score above this",
                  &TC::guard_z_threshold),
      RealSetting("guard-grad-z-threshold", "gradient-norm spike: robust z-score above this",
                  &TC::guard_grad_z_threshold),
      IntSetting("guard-window", "iterations in the guard's robust windows", &TC::guard_window),
      IntSetting("guard-min-history", "normal iterations seen before spikes are detected",
                 &TC::guard_min_history),
      IntSetting("guard-divergence-window",
                 "iterations whose median loss is compared with its lowest level",
                 &TC::guard_divergence_window),
      RealSetting("guard-divergence-rel",
                  "divergence: that median above (1 + this) x the lowest level",
                  &TC::guard_divergence_rel),
      IntSetting("guard-max-skips", "anomalous updates skipped in a row before rolling back",
                 &TC::guard_max_skips),
      IntSetting("guard-recover-iters",
                 "roll back when the loss is not back at its pre-onset level after this many "
                 "iterations",
                 &TC::guard_recover_iters),
      IntSetting("guard-rollback-margin",
                 "roll back to a healthy checkpoint at least this many iterations before the "
                 "onset",
                 &TC::guard_rollback_margin),
      IntSetting("guard-skip-before", "skipped data window: iterations before the onset",
                 &TC::guard_skip_before),
      IntSetting("guard-skip-after", "skipped data window: iterations after the onset",
                 &TC::guard_skip_after),
      RealSetting("guard-lr-cut", "LR factor applied by an escalated rollback", &TC::guard_lr_cut),
      IntSetting("guard-max-rollbacks", "rollbacks allowed before the run stops with a report",
                 &TC::guard_max_rollbacks),
      IntSetting("guard-escalation-window",
                 "a rollback within this many iterations of the previous one escalates",
                 &TC::guard_escalation_window),
      StringListSetting("skip-train-iteration-range", "A-B ...",
                        "skip the data of these iterations (inclusive ranges): read past, no "
                        "update",
                        &TC::skip_train_iteration_range),
      StringListSetting("skip-train-samples-range", "A-B ...",
                        "skip the iterations that read these samples (inclusive, 0-based "
                        "positions in the sample stream)",
                        &TC::skip_train_samples_range),
      // output
      IntSetting("sample-tokens", "tokens generated at the end (0: none)", &TC::sample_tokens),
      StringSetting("sample-prompt", "TEXT", "prompt for the end-of-run sample",
                    &TC::sample_prompt),
  };
  return *table;
}

const Setting* FindSetting(std::string_view name) {
  for (const Setting& s : Settings()) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// "did you mean --num-layers?" for the nearest name, or a pointer to --help when nothing is near.
std::string Suggest(std::string_view name, std::string_view prefix) {
  const Setting* best = nullptr;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const Setting& s : Settings()) {
    size_t d = EditDistance(name, s.name);
    if (d < best_d) best_d = d, best = &s;
  }
  if (best != nullptr && best_d <= std::max<size_t>(3, name.size() / 2)) {
    return fmt::format("did you mean {}{}? (keel train --help lists all)", prefix, best->name);
  }
  return "run `keel train --help` for the list of settings";
}

// ---------------------------------------------------------------------------------------------
// Applying a source (one TOML document, or the command line).

struct Entry {
  const Setting* setting;
  std::unique_ptr<Input> input;
};

struct ExclusivePair {
  const char* a;
  int64_t TrainConfig::*fa;
  const char* b;
  int64_t TrainConfig::*fb;
};
constexpr ExclusivePair kExclusive[] = {
    {"train-iters", &TC::train_iters, "train-samples", &TC::train_samples},
    {"lr-warmup-iters", &TC::lr_warmup_iters, "lr-warmup-samples", &TC::lr_warmup_samples},
};

// Applies the entries of one source; `prefix` is "--" for flags and "" for TOML keys.
Status ApplyEntries(const std::vector<Entry>& entries, std::string_view source,
                    std::string_view prefix, TrainConfig* cfg, std::set<std::string>* given) {
  std::set<std::string> here;
  for (const Entry& e : entries) {
    KEEL_RETURN_IF_ERROR(e.setting->set(*e.input, cfg));
    here.insert(e.setting->name);
  }
  for (const ExclusivePair& p : kExclusive) {
    bool a = here.count(p.a) && cfg->*p.fa > 0;
    bool b = here.count(p.b) && cfg->*p.fb > 0;
    if (a && b) {
      return Status::InvalidArgument(fmt::format(
          "{}: {}{} {} and {}{} {} are both set: they are mutually exclusive (a run counts either "
          "iterations or samples); set only one of them",
          source, prefix, p.a, cfg->*p.fa, prefix, p.b, cfg->*p.fb));
    }
    if (a) cfg->*p.fb = 0;
    if (b) cfg->*p.fa = 0;
  }
  given->insert(here.begin(), here.end());
  return Status::OK();
}

// The built-in warmup is counted in iterations, which a samples-based run may not use; drop it
// there unless the user asked for it (Validate then explains the samples form).
void DropDefaultIterWarmup(const std::set<std::string>& given, TrainConfig* cfg) {
  if (cfg->train_samples > 0 && !given.count("lr-warmup-iters") &&
      cfg->lr_warmup_iters == TrainConfig{}.lr_warmup_iters) {
    cfg->lr_warmup_iters = 0;
  }
}

// toml++ 3.3.0 (Debian 12's) reaches __builtin_unreachable() when it asks whether some non-ASCII
// characters (U+00A1..U+0499 and others) are whitespace: undefined behaviour on a config file
// (marzer/tomlplusplus#190, #295). It asks outside strings and comments, where TOML allows no
// non-ASCII text anyway, and around a multi-line string's line-ending backslash; keel refuses
// non-ASCII text in exactly those places before toml++ reads the file. Where a string starts
// follows toml++: a quote inside a bare value ("0\"") is read ahead as part of that value.
Status CheckTomlNonAscii(std::string_view text, const std::string& origin) {
  int line = 1;
  size_t line_start = 0;
  auto refuse = [&](size_t at, std::string_view what) {
    return Status::InvalidArgument(
        fmt::format("{}:{}:{}: invalid TOML: {}", origin, line, at - line_start + 1, what));
  };
  auto newline = [&](size_t at) {
    ++line;
    line_start = at + 1;
  };
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  auto ascii = [](char c) { return static_cast<unsigned char>(c) < 0x80; };
  auto key_char = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  };
  std::vector<char> nest;  // '[' arrays and '{' inline tables of the value being read
  bool key = true;         // the next token is a key (else a value)
  enum class Bare { kNone, kKey, kValue } bare = Bare::kNone;
  size_t i = text.starts_with("\xEF\xBB\xBF") ? 3 : 0;  // a byte-order mark (toml++ skips it)
  while (i < text.size()) {
    const char c = text[i];
    if (c == '\n' || space(c) || c == '#') {
      bare = Bare::kNone;
      if (c == '\n') {
        newline(i);
        if (nest.empty()) key = true;
      } else if (c == '#') {  // a comment runs to the end of the line
        while (i + 1 < text.size() && text[i + 1] != '\n') ++i;
      }
      ++i;
      continue;
    }
    if (!ascii(c)) return refuse(i, "a non-ASCII character outside a string or comment");
    if (bare == Bare::kValue && c != ',' && c != ']' && c != '}') {
      ++i;  // toml++ reads a bare value (number, date, ...) ahead up to a terminator
      continue;
    }
    if (bare == Bare::kKey && key_char(c)) {
      ++i;
      continue;
    }
    bare = Bare::kNone;
    if (c == '"' || c == '\'') {
      const std::string_view quotes = c == '"' ? "\"\"\"" : "'''";
      const bool multi = text.substr(i).starts_with(quotes);
      i += multi ? 3 : 1;
      while (i < text.size()) {
        const char d = text[i];
        if (d == '\n') {
          if (!multi) break;  // an unterminated string: toml++ stops here
          newline(i++);
        } else if (d == '\\' && c == '"') {
          ++i;
          if (multi && i < text.size() && (space(text[i]) || !ascii(text[i]))) {
            // A line-ending backslash: toml++ tests each character up to the next text.
            while (i < text.size() && space(text[i])) {
              if (text[i] == '\n') newline(i);
              ++i;
            }
            if (i < text.size() && !ascii(text[i]))
              return refuse(i,
                            "a non-ASCII character right after a line-ending backslash in a "
                            "multi-line string; write it as \\uXXXX");
          } else if (i < text.size() && text[i] != '\n') {
            ++i;  // the escaped character
          }
        } else if (d == c && (!multi || text.substr(i).starts_with(quotes))) {
          i += multi ? 3 : 1;
          // Up to two more quotes end a multi-line string's text ("""a""""" is a"").
          for (int k = 0; multi && k < 2 && i < text.size() && text[i] == c; ++k) ++i;
          break;
        } else {
          ++i;
        }
      }
      continue;
    }
    if (c == '=') {
      key = false;
    } else if (c == '[' && !key) {
      nest.push_back('[');
    } else if (c == '{' && !key) {
      nest.push_back('{');
      key = true;
    } else if (c == ',' && !nest.empty()) {
      key = nest.back() == '{';
    } else if ((c == ']' || c == '}') && !nest.empty() && nest.back() == (c == ']' ? '[' : '{')) {
      nest.pop_back();
      key = false;
    } else if (c != '[' && c != ']' && c != '{' && c != '}' && c != ',' && !(c == '.' && key)) {
      bare = key ? Bare::kKey : Bare::kValue;  // '.' separates the parts of a dotted key
    }
    ++i;
  }
  return Status::OK();
}

Status ApplyTomlImpl(const std::string& text, const std::string& origin, TrainConfig* cfg,
                     std::set<std::string>* given) {
  KEEL_RETURN_IF_ERROR(CheckTomlNonAscii(text, origin));
  toml::table doc;
  try {
    doc = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    return Status::InvalidArgument(fmt::format("{}:{}:{}: invalid TOML: {}", origin,
                                               e.source().begin.line, e.source().begin.column,
                                               e.description()));
  }
  std::vector<Entry> entries;
  for (const auto& [key, node] : doc) {
    std::string k(key.str());
    int line = static_cast<int>(key.source().begin.line);
    if (k == "config") {
      return Status::InvalidArgument(fmt::format(
          "{}:{}: config: a TOML file cannot include another; pass one file with --config", origin,
          line));
    }
    const Setting* s = FindSetting(k);
    if (s == nullptr) {
      return Status::InvalidArgument(
          fmt::format("{}:{}: unknown key '{}': {}", origin, line, k, Suggest(k, "")));
    }
    entries.push_back({s, std::make_unique<TomlInput>(origin, k, node)});
  }
  return ApplyEntries(entries, origin, "", cfg, given);
}

// ---------------------------------------------------------------------------------------------
// Validation helpers.

Status Invalid(std::string msg) {
  return Status::InvalidArgument(std::move(msg));
}

int64_t RoundUp(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

Status Positive(const char* flag, int64_t v) {
  if (v > 0) return Status::OK();
  return Invalid(fmt::format("--{} {} must be positive; set --{} to 1 or more", flag, v, flag));
}

Status NonNegative(const char* flag, int64_t v, std::string_view fix) {
  if (v >= 0) return Status::OK();
  return Invalid(fmt::format("--{} {} must not be negative; {}", flag, v, fix));
}

// Validates "a,b,c": three non-negative weights, not all zero.
Status CheckSplit(const std::string& split) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t comma = split.find(',', start);
    parts.push_back(split.substr(start, comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  bool ok = parts.size() == 3;
  double sum = 0;
  for (const auto& p : parts) {
    auto v = ParseWhole<double>(p);
    if (!v || !std::isfinite(*v) || *v < 0) ok = false;
    if (v) sum += *v;
  }
  if (ok && sum > 0) return Status::OK();
  return Invalid(fmt::format(
      "--split '{}' must be three non-negative train,valid,test weights, not all zero; try --split "
      "969,30,1",
      split));
}

Status ValidateModel(TrainConfig* c, std::vector<std::string>* notes) {
  KEEL_RETURN_IF_ERROR(Positive("num-layers", c->num_layers));
  KEEL_RETURN_IF_ERROR(Positive("hidden-size", c->hidden_size));
  KEEL_RETURN_IF_ERROR(Positive("num-attention-heads", c->num_attention_heads));
  KEEL_RETURN_IF_ERROR(Positive("seq-length", c->seq_length));
  if (c->hidden_size % c->num_attention_heads != 0) {
    int h = c->hidden_size, n = c->num_attention_heads;
    // Suggest a head dimension that is a multiple of 8, and a power-of-two head count.
    int64_t step = int64_t{n} * 8;
    int64_t try_hidden = std::max<int64_t>(step, (h + step / 2) / step * step);
    int try_heads = 1;
    while (try_heads * 2 <= n && h % (try_heads * 2) == 0) try_heads *= 2;
    return Invalid(fmt::format(
        "--hidden-size {} is not divisible by --num-attention-heads {}: hidden size must be a "
        "multiple of the head count; try --hidden-size {} or --num-attention-heads {}",
        h, n, try_hidden, try_heads));
  }
  KEEL_RETURN_IF_ERROR(NonNegative("ffn-hidden-size", c->ffn_hidden_size,
                                   "set it to 0 for 4 * hidden-size, or give a positive size"));
  if (c->ffn_hidden_size == 0) {
    c->ffn_hidden_size = 4 * c->hidden_size;
    notes->push_back(
        fmt::format("--ffn-hidden-size not given: using 4 * hidden-size = {}", c->ffn_hidden_size));
  }
  KEEL_RETURN_IF_ERROR(NonNegative("max-position-embeddings", c->max_position_embeddings,
                                   "set it to 0 to use --seq-length"));
  if (c->max_position_embeddings == 0) {
    c->max_position_embeddings = c->seq_length;
    notes->push_back(
        fmt::format("--max-position-embeddings not given: using --seq-length = {}", c->seq_length));
  }
  if (c->position_embedding_type == PositionEmbedding::kLearnedAbsolute &&
      c->max_position_embeddings < c->seq_length) {
    return Invalid(fmt::format(
        "--max-position-embeddings {} is smaller than --seq-length {}: learned absolute positions "
        "need a table row for every position; try --max-position-embeddings {} or --seq-length {}",
        c->max_position_embeddings, c->seq_length, c->seq_length, c->max_position_embeddings));
  }
  if (c->make_vocab_size_divisible_by < 1) {
    return Invalid(fmt::format(
        "--make-vocab-size-divisible-by {} must be at least 1; try --make-vocab-size-divisible-by "
        "128",
        c->make_vocab_size_divisible_by));
  }
  if (!(c->layernorm_epsilon > 0)) {
    return Invalid(
        fmt::format("--layernorm-epsilon {} must be positive; try --layernorm-epsilon 1e-5",
                    c->layernorm_epsilon));
  }
  if (!(c->init_method_std > 0)) {
    return Invalid(fmt::format("--init-method-std {} must be positive; try --init-method-std 0.02",
                               c->init_method_std));
  }
  return Status::OK();
}

Status ValidateBatch(TrainConfig* c, std::vector<std::string>* notes) {
  KEEL_RETURN_IF_ERROR(Positive("micro-batch-size", c->micro_batch_size));
  if (c->data_parallel_size < 1) {
    return Status::Internal(
        fmt::format("data-parallel size {} must be at least 1", c->data_parallel_size));
  }
  const int64_t m = int64_t{c->micro_batch_size} * c->data_parallel_size;
  const std::string m_text = fmt::format("--micro-batch-size {} * data-parallel size {} = {}",
                                         c->micro_batch_size, c->data_parallel_size, m);
  KEEL_RETURN_IF_ERROR(NonNegative("global-batch-size", c->global_batch_size,
                                   "set it to 0 for micro-batch-size * data-parallel size"));
  if (c->global_batch_size == 0) {
    c->global_batch_size = static_cast<int>(m);
    notes->push_back(fmt::format("--global-batch-size not given: using {}", m_text));
  }
  const int64_t g = c->global_batch_size;
  if (g % m != 0) {
    int64_t down = g / m * m, up = down + m;
    return Invalid(
        fmt::format("--global-batch-size {} is not divisible by {}: every iteration must be whole "
                    "micro-batches on every rank; try --global-batch-size {}",
                    g, m_text, down > 0 ? fmt::format("{} or {}", down, up) : std::to_string(up)));
  }
  if (c->rampup_batch_size.empty()) return Status::OK();

  const auto& r = c->rampup_batch_size;
  if (r.size() != 3) {
    return Invalid(
        fmt::format("--rampup-batch-size takes 3 values (start increment samples), got {}; e.g. "
                    "--rampup-batch-size 16 16 5859375",
                    r.size()));
  }
  const std::string given = fmt::format("--rampup-batch-size {} {} {}", r[0], r[1], r[2]);
  if (c->train_samples <= 0) {
    return Invalid(fmt::format(
        "{}: expected no batch-size rampup for iteration-based training; give the run length "
        "with --train-samples (and --lr-warmup-samples / --lr-decay-samples) instead of "
        "--train-iters, or drop --rampup-batch-size",
        given));
  }
  if (r[0] <= 0 || r[1] <= 0 || r[2] <= 0) {
    return Invalid(fmt::format(
        "{}: start, increment and samples must all be positive; e.g. --rampup-batch-size {} {} {}",
        given, m, m, std::max<int64_t>(r[2], 1000 * m)));
  }
  if (r[0] > g) {
    return Invalid(fmt::format(
        "{}: start batch {} is larger than --global-batch-size {}: the ramp-up grows towards the "
        "global batch; use a start of at most {}",
        given, r[0], g, g));
  }
  if ((g - r[0]) % r[1] != 0) {
    // Suggest the largest smaller increment that divides the gap, preferring whole micro-batches.
    int64_t diff = g - r[0], d = r[1];
    while (d > 1 && (diff % d != 0 || d % m != 0)) --d;
    if (diff % d != 0 || d % m != 0) {
      for (d = r[1]; diff % d != 0;) --d;
    }
    return Invalid(fmt::format(
        "{}: --global-batch-size {} minus start {} = {} is not a multiple of the increment {}: "
        "the ramp-up must land exactly on the global batch; try increment {}",
        given, g, r[0], diff, r[1], d));
  }
  // Every stage start, start+incr, ..., global must split into whole micro-batches on every rank.
  int64_t bad = r[0] % m != 0 ? r[0] : (g > r[0] && r[1] % m != 0) ? r[0] + r[1] : 0;
  if (bad != 0) {
    return Invalid(fmt::format(
        "{}: ramp-up batch size {} is not divisible by {}: every batch size during the ramp-up "
        "must be whole micro-batches on every rank; use a start and increment that are multiples "
        "of {}, or a smaller micro-batch or data-parallel size",
        given, bad, m_text, m));
  }
  if (r[2] > c->train_samples) {
    return Invalid(fmt::format(
        "{}: ramp-up samples {} exceed --train-samples {}: the run would end before reaching the "
        "global batch; use ramp-up samples of at most {}",
        given, r[2], c->train_samples, c->train_samples));
  }
  return Status::OK();
}

Status ValidateSchedule(TrainConfig* c, std::vector<std::string>* notes) {
  KEEL_RETURN_IF_ERROR(NonNegative("train-iters", c->train_iters, "give a positive length"));
  KEEL_RETURN_IF_ERROR(NonNegative("train-samples", c->train_samples, "give a positive length"));
  if (c->train_iters == 0 && c->train_samples == 0) {
    return Invalid(
        "neither --train-iters nor --train-samples is set: give the run length with exactly one "
        "of them, e.g. --train-iters 300");
  }
  if (c->train_iters > 0 && c->train_samples > 0) {
    return Invalid(fmt::format(
        "--train-iters {} and --train-samples {} are both set: a run counts either iterations or "
        "samples; set the other to 0",
        c->train_iters, c->train_samples));
  }
  for (auto [flag, v] : {std::pair{"lr-warmup-samples", c->lr_warmup_samples},
                         {"lr-warmup-iters", c->lr_warmup_iters},
                         {"lr-decay-samples", c->lr_decay_samples},
                         {"lr-decay-iters", c->lr_decay_iters}}) {
    KEEL_RETURN_IF_ERROR(NonNegative(flag, v, "use 0 or a positive length"));
  }
  const int64_t g = c->global_batch_size;
  const bool constant = c->lr_decay_style == LrDecayStyle::kConstant;
  if (c->train_iters > 0) {
    // Megatron: an iteration-based run uses the iteration forms of the schedule flags.
    if (c->lr_warmup_samples > 0) {
      return Invalid(fmt::format(
          "--lr-warmup-samples {} is for samples-based runs, but this run is iteration-based "
          "(--train-iters {}): use --lr-warmup-iters {} instead",
          c->lr_warmup_samples, c->train_iters, (c->lr_warmup_samples + g - 1) / g));
    }
    if (c->lr_decay_samples > 0) {
      return Invalid(fmt::format(
          "--lr-decay-samples {} is for samples-based runs, but this run is iteration-based "
          "(--train-iters {}): use --lr-decay-iters {} instead",
          c->lr_decay_samples, c->train_iters, (c->lr_decay_samples + g - 1) / g));
    }
    if (c->lr_decay_iters == 0) {
      c->lr_decay_iters = c->train_iters;
      if (!constant) {
        notes->push_back(
            fmt::format("--lr-decay-iters not given: decaying over the whole run, {} iterations",
                        c->train_iters));
      }
    }
    if (!constant && c->lr_warmup_iters >= c->lr_decay_iters) {
      return Invalid(fmt::format(
          "--lr-warmup-iters {} is not smaller than --lr-decay-iters {}: warmup must end before "
          "the decay does; try --lr-warmup-iters {} or a longer --lr-decay-iters",
          c->lr_warmup_iters, c->lr_decay_iters, c->lr_decay_iters / 10));
    }
  } else {
    if (c->lr_warmup_iters > 0) {
      return Invalid(fmt::format(
          "--lr-warmup-iters {} is for iteration-based runs, but this run is samples-based "
          "(--train-samples {}): use --lr-warmup-samples {} (iterations * global batch {}) and "
          "--lr-warmup-iters 0",
          c->lr_warmup_iters, c->train_samples, c->lr_warmup_iters * g, g));
    }
    if (c->lr_decay_iters > 0) {
      return Invalid(fmt::format(
          "--lr-decay-iters {} is for iteration-based runs, but this run is samples-based "
          "(--train-samples {}): use --lr-decay-samples {} (iterations * global batch {}) and "
          "--lr-decay-iters 0",
          c->lr_decay_iters, c->train_samples, c->lr_decay_iters * g, g));
    }
    if (c->lr_decay_samples == 0) {
      c->lr_decay_samples = c->train_samples;
      if (!constant) {
        notes->push_back(
            fmt::format("--lr-decay-samples not given: decaying over the whole run, {} samples",
                        c->train_samples));
      }
    }
    if (!constant && c->lr_warmup_samples >= c->lr_decay_samples) {
      return Invalid(fmt::format(
          "--lr-warmup-samples {} is not smaller than --lr-decay-samples {}: warmup must end "
          "before the decay does; try --lr-warmup-samples {} or a longer --lr-decay-samples",
          c->lr_warmup_samples, c->lr_decay_samples, c->lr_decay_samples / 10));
    }
  }
  if (!(c->lr > 0)) {
    return Invalid(fmt::format("--lr {} must be positive; try --lr 1e-3", c->lr));
  }
  if (!(c->min_lr >= 0 && c->min_lr <= c->lr)) {
    return Invalid(fmt::format(
        "--min-lr {} must be between 0 and --lr {}: decay goes down to it; try --min-lr {}",
        c->min_lr, c->lr, c->lr / 10));
  }
  return Status::OK();
}

Status ValidateOptimizerAndRun(TrainConfig* c) {
  for (auto [flag, v] : {std::pair{"adam-beta1", c->adam_beta1}, {"adam-beta2", c->adam_beta2}}) {
    if (!(v >= 0 && v < 1)) {
      return Invalid(fmt::format(
          "--{} {} must be in [0, 1): it is the decay of a moving average; try --adam-beta1 0.9 "
          "--adam-beta2 0.95",
          flag, v));
    }
  }
  if (!(c->adam_eps > 0)) {
    return Invalid(fmt::format("--adam-eps {} must be positive; try --adam-eps 1e-8", c->adam_eps));
  }
  if (!(c->weight_decay >= 0)) {
    return Invalid(fmt::format(
        "--weight-decay {} must not be negative; use 0 to disable it or e.g. --weight-decay 0.1",
        c->weight_decay));
  }
  if (!(c->clip_grad >= 0)) {
    return Invalid(fmt::format(
        "--clip-grad {} must not be negative; use 0 to disable clipping or e.g. --clip-grad 1.0",
        c->clip_grad));
  }
  KEEL_RETURN_IF_ERROR(Positive("eval-interval", c->eval_interval));
  KEEL_RETURN_IF_ERROR(Positive("log-interval", c->log_interval));
  KEEL_RETURN_IF_ERROR(
      NonNegative("eval-iters", c->eval_iters, "use 0 to skip evaluation, e.g. --eval-iters 10"));
  KEEL_RETURN_IF_ERROR(
      NonNegative("threads", c->threads, "use 0 for all cores or a positive thread count"));
  KEEL_RETURN_IF_ERROR(NonNegative("sample-tokens", c->sample_tokens,
                                   "use 0 for no sample or a positive token count"));
  KEEL_RETURN_IF_ERROR(NonNegative("save-interval", c->save_interval,
                                   "use 0 to save only at the end and on stop requests"));
  KEEL_RETURN_IF_ERROR(
      NonNegative("keep-last-checkpoints", c->keep_last_checkpoints, "use 0 to keep all"));
  KEEL_RETURN_IF_ERROR(NonNegative("exit-interval", c->exit_interval, "use 0 to disable it"));
  for (auto [flag, v] :
       {std::pair<const char*, double>{"save-interval-minutes", c->save_interval_minutes},
        {"exit-duration-in-mins", c->exit_duration_in_mins},
        {"lr-scale-on-resume", c->lr_scale_on_resume}}) {
    if (!(v >= 0))
      return Invalid(fmt::format("--{} {} must not be negative; use 0 to disable it", flag, v));
  }
  if (c->save.empty()) {
    if (!c->kill_switch_path.empty())
      return Invalid(
          "--kill-switch-path needs --save: the kill switch saves a checkpoint before "
          "exiting; pass --save DIR");
    if (!c->load.empty())
      return Invalid("--load " + c->load +
                     " needs --save: a resumed run must have somewhere to save; pass --save DIR");
  }
  return CheckSplit(c->split);
}

}  // namespace

// ---------------------------------------------------------------------------------------------

float TrainConfig::ResolvedInitStd() const {
  const double h = hidden_size;
  switch (init_method) {
    case InitMethod::kSmallInit:
      return static_cast<float>(std::sqrt(2.0 / (5.0 * h)));
    case InitMethod::kMegatron530B:
      return static_cast<float>(std::sqrt(1.0 / (3.0 * h)));
    case InitMethod::kNormal:
      break;
  }
  return init_method_std;
}

Status ApplyToml(const std::string& toml_text, const std::string& origin, TrainConfig* cfg) {
  std::set<std::string> given;
  KEEL_RETURN_IF_ERROR(ApplyTomlImpl(toml_text, origin, cfg, &given));
  DropDefaultIterWarmup(given, cfg);
  return Status::OK();
}

Status ParseTrainArgs(int argc, const char* const* argv, ParsedConfig* out) {
  *out = ParsedConfig();
  CLI::App app{
      "Pretrain a GPT-style model. Every setting is also a key of the --config TOML file "
      "(same name without dashes); flags override the file, the file overrides the defaults.",
      "keel train"};
  app.allow_extras();
  std::string config_path;
  app.add_option("--config", config_path, "TOML file of settings")->type_name("FILE");

  const TrainConfig defaults;
  const auto& settings = Settings();
  std::vector<std::vector<std::string>> raw(settings.size());
  std::vector<CLI::Option*> opts(settings.size());
  for (size_t i = 0; i < settings.size(); ++i) {
    const Setting& s = settings[i];
    std::string help = fmt::format("{} (default {})", s.help, s.get(defaults));
    std::string flag = "--" + s.name;
    if (s.is_flag) {
      opts[i] = app.add_flag(flag, raw[i], help);
    } else if (s.is_list) {
      // Takes any count so that Validate can say what was wrong with the values.
      opts[i] = app.add_option(flag, raw[i], help)->type_name(s.type)->expected(1, 1 << 20);
    } else {
      opts[i] = app.add_option(flag, raw[i], help)->type_name(s.type)->expected(1)->take_last();
    }
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    out->help_requested = true;
    out->help_text = app.help();
    return Status::OK();
  } catch (const CLI::ParseError& e) {
    return Status::InvalidArgument(fmt::format("{}; see keel train --help", e.what()));
  }
  std::vector<std::string> extras = app.remaining();
  if (!extras.empty()) {
    const std::string& arg = extras.front();
    const size_t name_at = arg.find_first_not_of('-');
    if (arg.rfind("-", 0) == 0 && name_at != std::string::npos) {  // not "---": no name in it
      std::string name = arg.substr(name_at);
      name = name.substr(0, name.find('='));
      return Status::InvalidArgument(
          fmt::format("unknown flag '{}': {}", arg, Suggest(name, "--")));
    }
    return Status::InvalidArgument(fmt::format(
        "unexpected argument '{}': keel train takes only --flag value pairs; see --help", arg));
  }

  TrainConfig cfg;
  std::set<std::string> given;
  if (!config_path.empty()) {
    std::string text;
    Status st = Env::Default()->ReadFileToString(config_path, &text);
    if (!st.ok()) {
      return Status::InvalidArgument(
          fmt::format("--config {}: cannot read the file ({})", config_path, st.message()));
    }
    KEEL_RETURN_IF_ERROR(ApplyTomlImpl(text, config_path, &cfg, &given));
  }
  std::vector<Entry> entries;
  for (size_t i = 0; i < settings.size(); ++i) {
    if (opts[i]->count() == 0) continue;
    entries.push_back({&settings[i], std::make_unique<CliInput>("--" + settings[i].name, raw[i])});
  }
  KEEL_RETURN_IF_ERROR(ApplyEntries(entries, "command line", "--", &cfg, &given));
  DropDefaultIterWarmup(given, &cfg);

  out->as_given = cfg;
  KEEL_RETURN_IF_ERROR(Validate(&cfg, &out->notes));
  out->config = std::move(cfg);
  return Status::OK();
}

Status ValidateGuard(const TrainConfig& c) {
  if (!(c.z_loss >= 0) || c.z_loss > 1)
    return Invalid(fmt::format(
        "--z-loss {} must be between 0 (off) and 1; PaLM used 1e-4, e.g. --z-loss 1e-4", c.z_loss));
  for (auto [flag, v] : {std::pair{"guard-z-threshold", c.guard_z_threshold},
                         std::pair{"guard-grad-z-threshold", c.guard_grad_z_threshold},
                         std::pair{"guard-divergence-rel", c.guard_divergence_rel}}) {
    if (!(v > 0))
      return Invalid(fmt::format("--{} {} must be positive; the default is {}", flag, v,
                                 FindSetting(flag)->get(TrainConfig{})));
  }
  if (!(c.guard_lr_cut > 0 && c.guard_lr_cut <= 1))
    return Invalid(fmt::format(
        "--guard-lr-cut {} must be in (0, 1]: it multiplies the LR on an escalated rollback; "
        "try 0.5",
        c.guard_lr_cut));
  KEEL_RETURN_IF_ERROR(Positive("guard-window", c.guard_window));
  KEEL_RETURN_IF_ERROR(Positive("guard-divergence-window", c.guard_divergence_window));
  KEEL_RETURN_IF_ERROR(Positive("guard-recover-iters", c.guard_recover_iters));
  if (c.guard_min_history < 3 || c.guard_min_history > c.guard_window)
    return Invalid(fmt::format(
        "--guard-min-history {} must be between 3 and --guard-window {}: robust statistics need "
        "a few values and cannot use more than the window holds",
        c.guard_min_history, c.guard_window));
  for (auto [flag, v] : {std::pair{"guard-max-skips", c.guard_max_skips},
                         std::pair{"guard-rollback-margin", c.guard_rollback_margin},
                         std::pair{"guard-skip-before", c.guard_skip_before},
                         std::pair{"guard-skip-after", c.guard_skip_after},
                         std::pair{"guard-max-rollbacks", c.guard_max_rollbacks},
                         std::pair{"guard-escalation-window", c.guard_escalation_window}})
    KEEL_RETURN_IF_ERROR(NonNegative(flag, v, "give 0 or more"));
  std::vector<std::pair<int64_t, int64_t>> ranges;
  KEEL_RETURN_IF_ERROR(ParseIterationRanges(c.skip_train_iteration_range, &ranges));
  return ParseSampleRanges(c.skip_train_samples_range, &ranges);
}

Status Validate(TrainConfig* cfg, std::vector<std::string>* notes) {
  KEEL_RETURN_IF_ERROR(ValidateModel(cfg, notes));
  KEEL_RETURN_IF_ERROR(ValidateGuard(*cfg));
  KEEL_RETURN_IF_ERROR(ValidateBatch(cfg, notes));
  KEEL_RETURN_IF_ERROR(ValidateSchedule(cfg, notes));
  KEEL_RETURN_IF_ERROR(ValidateOptimizerAndRun(cfg));
  if (cfg->vocab_size < 0) {
    return Status::InvalidArgument(
        fmt::format("vocabulary size {} is negative: the dataset metadata is wrong; rebuild it",
                    cfg->vocab_size));
  }
  if (cfg->vocab_size > 0) {
    const int64_t mult = cfg->make_vocab_size_divisible_by;
    cfg->padded_vocab_size = static_cast<int>(RoundUp(cfg->vocab_size, mult));
    notes->push_back(fmt::format("vocab {} padded to {} (multiple of {})", cfg->vocab_size,
                                 cfg->padded_vocab_size, mult));
  }
  return Status::OK();
}

namespace {

Status ParseRanges(const std::vector<std::string>& text, const char* flag, int64_t min_first,
                   const char* what, const char* example,
                   std::vector<std::pair<int64_t, int64_t>>* out) {
  out->clear();
  for (const std::string& r : text) {
    const size_t dash = r.find('-');
    std::optional<int64_t> a, b;
    if (dash != std::string::npos) {
      a = ParseWhole<int64_t>(std::string_view(r).substr(0, dash));
      b = ParseWhole<int64_t>(std::string_view(r).substr(dash + 1));
    }
    if (!a || !b || *a < min_first || *b < *a)
      return Invalid(
          fmt::format("--{} {}: expected FIRST-LAST with {} <= FIRST <= LAST ({}), e.g. --{} {}",
                      flag, r, min_first, what, flag, example));
    out->emplace_back(*a, *b);
  }
  return Status::OK();
}

}  // namespace

Status ParseIterationRanges(const std::vector<std::string>& text,
                            std::vector<std::pair<int64_t, int64_t>>* out) {
  return ParseRanges(text, "skip-train-iteration-range", 1, "inclusive iterations",
                     "101-200 301-400", out);
}

Status ParseSampleRanges(const std::vector<std::string>& text,
                         std::vector<std::pair<int64_t, int64_t>>* out) {
  return ParseRanges(text, "skip-train-samples-range", 0, "inclusive 0-based sample positions",
                     "204800-409599", out);
}

std::string FormatConfig(const TrainConfig& cfg) {
  std::string out;
  for (const Setting& s : Settings()) out += fmt::format("{} = {}\n", s.name, s.get(cfg));
  // Values that are not settings: shown (and hashed) as comments so the text stays loadable.
  out += fmt::format("# data-parallel-size = {}\n", cfg.data_parallel_size);
  out += fmt::format("# vocab-size = {}\n", cfg.vocab_size);
  out += fmt::format("# padded-vocab-size = {}\n", cfg.padded_vocab_size);
  return out;
}

std::vector<std::pair<std::string, std::string>> ConfigValues(const TrainConfig& cfg) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const Setting& s : Settings()) out.emplace_back(s.name, s.get(cfg));
  return out;
}

uint64_t ConfigHash(const TrainConfig& cfg) {
  const std::string text = FormatConfig(cfg);
  return XXH3_64bits(text.data(), text.size());
}

}  // namespace keel

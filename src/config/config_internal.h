// What the pieces of the config module share, and nothing outside src/config includes: the value
// sources (a flag's text or a TOML node), the one settings table, and the small parsing and
// formatting helpers.
//   config_settings.cc  the settings table: flags, TOML keys, help, "did you mean" suggestions
//   config_sources.cc   reading the command line and TOML files (ParseTrainArgs, ApplyToml)
//   config_validate.cc  the rules (Validate), skip ranges, limits
//   config_defaults.cc  the values keel chooses on the user's behalf (ResolveDefaults)
//   config_format.cc    values as TOML literals, FormatConfig, ConfigValues, ConfigHash
//   toml_screen.cc      refuses the TOML text that toml++ 3.3 cannot read safely
//   megatron_flags.cc   Megatron-LM / Megatron-DeepSpeed flags that are not settings: aliases,
//                       flags that change nothing here, and features keel does not have yet
//   deepspeed_config.cc the DeepSpeed config JSON of --deepspeed_config
#pragma once

#include <charconv>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "config/train_config.h"
#include "core/status.h"

namespace keel::config_internal {

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

// The whole of `s` as a number, or nothing (no leading spaces, signs only where from_chars takes
// them, no trailing text).
template <typename T>
std::optional<T> ParseWhole(std::string_view s) {
  T v{};
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, v);
  if (ec != std::errc() || p != end || s.empty()) return std::nullopt;
  return v;
}

// Sizes the model and its kernels compute with in int: tokens and (sequence, head) pairs of a
// micro-batch, the 3h and 4h widths, the layer count plus one, the padded vocabulary.
inline constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();

inline int64_t RoundUp(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

// Fills every value keel chooses on the user's behalf (FFN size, max positions, global batch,
// decay length, precision recipe, tokenizer type, padded vocabulary), each with a note. Called by
// Validate once the given values are checked (so none of its products overflows); fails only
// where a default itself does not exist (SwiGLU's FFN rule gives 0, a default above kMaxInt).
Status ResolveDefaults(TrainConfig* cfg, std::vector<std::string>* notes);

// A command-line integer as Megatron's argparse reads it (Python's int(): `220_000_000`, `+5`).
std::optional<int64_t> ParseCliInt(std::string_view s);

// One setting: its flag and TOML key, how --help shows it, and how it is set from an Input and
// read back as a TOML literal.
struct Setting {
  std::string name;  // flag without dashes, and TOML key
  std::string type;  // shown in --help, e.g. INT
  std::string help;
  bool is_flag = false;  // a bool: `--name` alone means true
  bool is_list = false;  // takes several values on the command line
  std::function<Status(const Input&, TrainConfig*)> set;
  std::function<std::string(const TrainConfig&)> get;  // TOML literal
};

// The settings table, in the order --help and FormatConfig list them.
const std::vector<Setting>& Settings();
// The setting named `name` (without dashes), or null.
const Setting* FindSetting(std::string_view name);
// "did you mean --num-layers?" for the nearest name, or a pointer to --help when nothing is near.
std::string Suggest(std::string_view name, std::string_view prefix);

// ---------------------------------------------------------------------------------------------
// Flags of Megatron-LM and Megatron-DeepSpeed launch scripts that are not keel settings
// (megatron_flags.cc). Each is one of:
//   kAlias     Megatron's spelling of a keel setting: applied to it, the canonical name noted;
//   kAccepted  changes nothing in keel (or not at this value): accepted with a note saying why;
//   kNotYet    a feature keel does not have yet (at this value): exit 2 naming it.
// Some are kAccepted at one value and kNotYet at another (--tensor-model-parallel-size 1 / 4).
struct ForeignFlag {
  enum class Kind { kAlias, kAccepted, kNotYet };
  std::string name;  // without dashes, as Megatron spells it
  Kind kind = Kind::kAccepted;
  bool is_flag = false;  // store_true: `--name` alone
  bool is_list = false;  // nargs='+'
  std::string alias_of;  // kAlias: the keel setting (or another foreign flag) it stands for
  std::string help;      // for --help
};
const std::vector<ForeignFlag>& ForeignFlags();
const ForeignFlag* FindForeignFlag(std::string_view name);

// One foreign flag as given (its values as text, "true" for a bare switch).
struct ForeignGiven {
  const ForeignFlag* flag = nullptr;
  std::vector<std::string> values;
  std::string where;  // "--data-impl mmap" or "run.toml:3: data-impl = ..."
};

// Resolves the non-alias foreign flags against the config the settings made (some depend on other
// values: --pp-partition-method means nothing with one pipeline stage). `notes` gets a note per
// accepted flag; the error names every flag whose feature keel lacks, at once.
// `settings_given` lists the settings set explicitly (a conflict with one is an error);
// `zero_stage` is --zero-stage's or the DeepSpeed config's ZeRO stage (-1: neither gave one).
Status ResolveForeignFlags(const std::vector<ForeignGiven>& given,
                           const std::set<std::string>& settings_given, int zero_stage,
                           TrainConfig* cfg, std::vector<std::string>* notes);

// Reads the DeepSpeed config JSON of cfg->deepspeed_config (when cfg->deepspeed) and applies what
// keel supports; see deepspeed_config.cc. `settings_given` are the settings set by flags or the
// --config file, `zero_stage` the --zero-stage flag's value (-1: not given); the stage the JSON
// sets goes back through it.
Status ApplyDeepSpeedConfig(const std::set<std::string>& settings_given, int* zero_stage,
                            TrainConfig* cfg, std::vector<std::string>* notes);

// `s` as a TOML basic string literal, quoted and escaped.
std::string TomlString(const std::string& s);

// toml++ 3.3 reaches __builtin_unreachable() on non-ASCII text outside strings and comments and
// right after a multi-line string's line-ending backslash; refuses that text as invalid TOML at
// origin:line:column (where TOML allows no such text anyway).
Status CheckTomlNonAscii(std::string_view text, const std::string& origin);

}  // namespace keel::config_internal

// Reading a TrainConfig from its two sources: the `keel train` command line (CLI11) and TOML
// files (toml++). Both turn each given value into an Input and hand it to its setting's setter;
// a source's values are applied together so that exclusive pairs can be checked per source.
#include <fmt/format.h>
#include <toml++/toml.h>

#include <CLI/CLI.hpp>
#include <cctype>
#include <memory>
#include <set>
#include <sstream>
#include <utility>

#include "config/config.h"
#include "config/config_internal.h"
#include "core/env.h"

namespace keel {
namespace {

using config_internal::ApplyDeepSpeedConfig;
using config_internal::CheckTomlNonAscii;
using config_internal::FindForeignFlag;
using config_internal::FindSetting;
using config_internal::ForeignFlag;
using config_internal::ForeignFlags;
using config_internal::ForeignGiven;
using config_internal::Input;
using config_internal::ParseCliInt;
using config_internal::ParseWhole;
using config_internal::ResolveForeignFlags;
using config_internal::Setting;
using config_internal::Settings;
using config_internal::Suggest;
using config_internal::TomlString;

// ---------------------------------------------------------------------------------------------
// The two kinds of Input: a flag's text values, and a TOML node.

// A number as Python's int() and float() read it, which is how Megatron's argparse reads flags:
// underscores between digits (`--train-samples 220_000_000`, in the BigScience scripts) and a
// leading '+' are dropped; anything else is left for ParseWhole to judge.
std::string PythonNumber(std::string_view s) {
  std::string out;
  size_t i = s.size() > 1 && s[0] == '+' && s[1] != '-' ? 1 : 0;
  for (; i < s.size(); ++i) {
    const bool digit_before = i > 0 && std::isdigit(static_cast<unsigned char>(s[i - 1]));
    const bool digit_after = i + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[i + 1]));
    if (s[i] == '_' && digit_before && digit_after) continue;
    out += s[i];
  }
  return out;
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
    return values_.size() == 1 ? ParseWhole<int64_t>(PythonNumber(values_[0])) : std::nullopt;
  }
  std::optional<uint64_t> UInt() const override {
    return values_.size() == 1 ? ParseWhole<uint64_t>(PythonNumber(values_[0])) : std::nullopt;
  }
  std::optional<double> Number() const override {
    return values_.size() == 1 ? ParseWhole<double>(PythonNumber(values_[0])) : std::nullopt;
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
      auto x = ParseWhole<int64_t>(PythonNumber(v));
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
    {"train-iters", &TrainConfig::train_iters, "train-samples", &TrainConfig::train_samples},
    {"lr-warmup-iters", &TrainConfig::lr_warmup_iters, "lr-warmup-samples",
     &TrainConfig::lr_warmup_samples},
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

// A TOML node as the text values a flag would have (for the Megatron flags, which take text).
std::vector<std::string> NodeText(const toml::node& node) {
  std::vector<std::string> out;
  auto one = [&](const toml::node& n) {
    if (auto s = n.value_exact<std::string>()) {
      out.push_back(*s);
    } else if (auto b = n.value_exact<bool>()) {
      out.push_back(*b ? "true" : "false");
    } else if (auto i = n.value_exact<int64_t>()) {
      out.push_back(std::to_string(*i));
    } else if (auto f = n.value_exact<double>()) {
      out.push_back(fmt::format("{}", *f));
    } else {
      out.push_back("?");
    }
  };
  if (const toml::array* arr = node.as_array()) {
    for (const toml::node& n : *arr) one(n);
  } else {
    one(node);
  }
  return out;
}

// `foreign` null: the Megatron flags are unknown keys here (a checkpoint's config.toml, which
// holds settings only).
Status ApplyAliases(std::vector<ForeignGiven>* foreign, std::vector<Entry>* entries,
                    const std::set<std::string>& same_source, std::vector<std::string>* notes);

Status ApplyTomlImpl(const std::string& text, const std::string& origin, TrainConfig* cfg,
                     std::set<std::string>* given, std::vector<ForeignGiven>* foreign,
                     std::vector<std::string>* notes) {
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
    if (s == nullptr && foreign != nullptr) {
      if (const ForeignFlag* f = FindForeignFlag(k)) {
        foreign->push_back({f, NodeText(node), fmt::format("{}:{}: {}", origin, line, k)});
        continue;
      }
    }
    if (s == nullptr) {
      return Status::InvalidArgument(
          fmt::format("{}:{}: unknown key '{}': {}", origin, line, k, Suggest(k, "")));
    }
    entries.push_back({s, std::make_unique<TomlInput>(origin, k, node)});
  }
  if (foreign != nullptr) {
    std::set<std::string> keys;
    for (const Entry& e : entries) keys.insert(e.setting->name);
    KEEL_RETURN_IF_ERROR(ApplyAliases(foreign, &entries, keys, notes));
  }
  return ApplyEntries(entries, origin, "", cfg, given);
}

// Megatron's spellings of keel settings: each becomes an entry of its setting, noted with the
// canonical name; a foreign flag's alias (--model-parallel-size) becomes that flag.
Status ApplyAliases(std::vector<ForeignGiven>* foreign, std::vector<Entry>* entries,
                    const std::set<std::string>& same_source, std::vector<std::string>* notes) {
  std::vector<ForeignGiven> kept;
  for (ForeignGiven& g : *foreign) {
    if (g.flag->kind != ForeignFlag::Kind::kAlias) {
      kept.push_back(std::move(g));
      continue;
    }
    const std::string& to = g.flag->alias_of;
    if (const Setting* s = FindSetting(to)) {
      if (same_source.count(to))
        return Status::InvalidArgument(fmt::format(
            "{} and --{} are both given: --{} is Megatron's spelling of keel's --{}; give one",
            g.where, to, g.flag->name, to));
      entries->push_back({s, std::make_unique<CliInput>("--" + g.flag->name, g.values)});
    } else {
      const ForeignFlag* f = FindForeignFlag(to);
      KEEL_CHECK(f != nullptr, "alias of an unknown flag: " + to);
      for (const ForeignGiven& o : *foreign)
        if (o.flag == f)
          return Status::InvalidArgument(
              fmt::format("{} and --{} are both given: --{} is the older name of --{}; give one",
                          g.where, to, g.flag->name, to));
      kept.push_back({f, g.values, g.where});
    }
    notes->push_back(fmt::format("--{} is read as --{}{}", g.flag->name, to,
                                 FindSetting(to) != nullptr ? " (keel's name)" : ""));
  }
  *foreign = std::move(kept);
  return Status::OK();
}

// The groups of --train/valid-weighted-split-paths-path, read into their settings as Megatron's
// argparse action does, so the config holds (and a resume compares) the groups themselves.
Status ReadWeightedSplitPathFiles(const std::set<std::string>& given, TrainConfig* cfg) {
  for (auto [flag, path, groups] :
       {std::tuple{"train-weighted-split-paths", &cfg->train_weighted_split_paths_path,
                   &cfg->train_weighted_split_paths},
        {"valid-weighted-split-paths", &cfg->valid_weighted_split_paths_path,
         &cfg->valid_weighted_split_paths}}) {
    if (path->empty()) continue;
    if (given.count(flag))
      return Status::InvalidArgument(fmt::format(
          "--{} and --{}-path are both given: the file holds the groups; give one", flag, flag));
    std::string text;
    Status st = Env::Default()->ReadFileToString(*path, &text);
    if (!st.ok())
      return Status::InvalidArgument(
          fmt::format("--{}-path {}: cannot read the file ({})", flag, *path, st.message()));
    KEEL_RETURN_IF_ERROR(
        SplitWeightedSplitPathsFile(text, "--" + std::string(flag) + "-path " + *path, groups));
  }
  return Status::OK();
}

// How many values `--name` takes on the command line: 0 (a switch), 1, or any (a list); -1 for a
// name that is no flag.
int ValuesTaken(const std::string& name) {
  if (name == "config") return 1;
  if (name == "help") return 0;
  if (const Setting* s = FindSetting(name)) return s->is_flag ? 0 : s->is_list ? 1 << 20 : 1;
  if (const ForeignFlag* f = FindForeignFlag(name))
    return f->is_flag ? 0 : f->is_list ? 1 << 20 : 1;
  return -1;
}

// The message for a word no flag took (`stray`, the first such): it is blamed on the flag before
// it, as CLI11 read the line: a flag that takes one value and was given more, or a switch.
std::string StrayArgument(int argc, const char* const* argv, const std::string& stray) {
  // "-1" and "-.5" are values (CLI11 reads them so); "-h" and "--name" are flags.
  auto is_flag = [](const std::string& a) {
    return a.size() > 1 && a[0] == '-' &&
           !(std::isdigit(static_cast<unsigned char>(a[1])) || a[1] == '.');
  };
  std::string written, flag, name;  // the last flag as written, without any "=value", its name
  int takes = -1;
  std::vector<std::string> values;  // what follows it, up to the next flag
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") break;
    if (is_flag(a)) {
      const size_t eq = a.find('=');
      written = a;
      flag = a.substr(0, eq);
      const size_t at = flag.find_first_not_of('-');
      name = at == std::string::npos ? "" : flag.substr(at);
      takes = flag.rfind("--", 0) == 0 ? ValuesTaken(name) : 0;
      values.clear();
      if (eq != std::string::npos) values.push_back(a.substr(eq + 1));
      continue;
    }
    values.push_back(a);
    if (static_cast<int>(values.size()) <= takes || a != stray) continue;
    for (int j = i + 1; j < argc && !is_flag(argv[j]) && std::string(argv[j]) != "--"; ++j)
      values.push_back(argv[j]);
    const std::string fix =
        "remove the extra word, or give it the flag it belongs to (see keel train --help)";
    if (takes == 0)
      return fmt::format(
          "unexpected argument '{}' after {}: {} is a switch and takes no value ({}=false turns "
          "it off); {}",
          stray, written, flag, flag, fix);
    if (takes == 1) {
      std::string given;
      for (const std::string& v : values) given += " " + v;
      return fmt::format(
          "unexpected argument '{}' after {} {}: {} takes one value and was given {}:{}; {}", stray,
          flag, values.front(), flag, values.size(), given, fix);
    }
    break;
  }
  return fmt::format(
      "unexpected argument '{}': keel train takes only --flag value pairs; see --help", stray);
}

}  // namespace

namespace config_internal {

std::optional<int64_t> ParseCliInt(std::string_view s) {
  return ParseWhole<int64_t>(PythonNumber(s));
}

}  // namespace config_internal

Status SplitWeightedSplitPathsFile(const std::string& text, const std::string& origin,
                                   std::vector<std::string>* groups) {
  groups->clear();
  std::string_view line(text);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
  const std::string fix =
      "expected one line of groups, each in double quotes: \"NAME: WEIGHT START:END PREFIX, ...\" "
      "\"NAME2: ...\" (what bigscience's load_ratios_meg_ds_format.py writes)";
  if (line.find('\n') != std::string_view::npos)
    return Status::InvalidArgument(origin + ": more than one line; " + fix);
  if (line.size() < 2 || line.front() != '"' || line.back() != '"')
    return Status::InvalidArgument(origin +
                                   ": the line does not start and end with a double "
                                   "quote; " +
                                   fix);
  line = line.substr(1, line.size() - 2);
  // Between two groups: a quote, spaces, a quote.
  size_t start = 0;
  while (true) {
    const size_t q = line.find('"', start);
    std::string_view group = line.substr(start, q == std::string_view::npos ? q : q - start);
    if (group.empty()) return Status::InvalidArgument(origin + ": an empty group; " + fix);
    groups->emplace_back(group);
    if (q == std::string_view::npos) break;
    size_t next = q + 1;
    while (next < line.size() && line[next] == ' ') ++next;
    if (next == q + 1 || next >= line.size() || line[next] != '"')
      return Status::InvalidArgument(origin + ": a double quote inside a group; " + fix);
    start = next + 1;
  }
  return Status::OK();
}

Status ApplyToml(const std::string& toml_text, const std::string& origin, TrainConfig* cfg) {
  std::set<std::string> given;
  KEEL_RETURN_IF_ERROR(ApplyTomlImpl(toml_text, origin, cfg, &given, nullptr, nullptr));
  DropDefaultIterWarmup(given, cfg);
  return Status::OK();
}

Status ReadTrainArgs(int argc, const char* const* argv, ParsedConfig* out) {
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
      // One value per use (a vector's extra values would be taken and all but the last dropped:
      // `--num-layers 1 3` trained 3 layers); a word after it is a stray, blamed below.
      opts[i] = app.add_option(flag, raw[i], help)
                    ->type_name(s.type)
                    ->expected(1)
                    ->allow_extra_args(false)
                    ->take_last();
    }
  }
  // Megatron's flags that are not settings (config_internal.h: ForeignFlag).
  const auto& foreign_flags = ForeignFlags();
  std::vector<std::vector<std::string>> fraw(foreign_flags.size());
  std::vector<CLI::Option*> fopts(foreign_flags.size());
  const std::string group = "Megatron-LM / Megatron-DeepSpeed flags (docs/config.md)";
  for (size_t i = 0; i < foreign_flags.size(); ++i) {
    const ForeignFlag& f = foreign_flags[i];
    const std::string flag = "--" + f.name;
    if (f.is_flag) {
      fopts[i] = app.add_flag(flag, fraw[i], f.help)->group(group);
    } else if (f.is_list) {
      fopts[i] = app.add_option(flag, fraw[i], f.help)->expected(1, 1 << 20)->group(group);
    } else {
      fopts[i] = app.add_option(flag, fraw[i], f.help)
                     ->expected(1)
                     ->allow_extra_args(false)
                     ->take_last()
                     ->group(group);
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
    // Not "---" (no name in it), nor "-1" (a number: a value no flag took).
    const bool number =
        arg.size() > 1 && (std::isdigit(static_cast<unsigned char>(arg[1])) || arg[1] == '.');
    if (arg.rfind("-", 0) == 0 && name_at != std::string::npos && !number) {
      std::string name = arg.substr(name_at);
      name = name.substr(0, name.find('='));
      return Status::InvalidArgument(
          fmt::format("unknown flag '{}': {}", arg, Suggest(name, "--")));
    }
    return Status::InvalidArgument(StrayArgument(argc, argv, arg));
  }

  TrainConfig cfg;
  std::set<std::string> given;
  std::vector<ForeignGiven> toml_foreign, foreign;
  std::vector<std::string>& notes = out->source_notes;
  if (!config_path.empty()) {
    std::string text;
    Status st = Env::Default()->ReadFileToString(config_path, &text);
    if (!st.ok()) {
      return Status::InvalidArgument(
          fmt::format("--config {}: cannot read the file ({})", config_path, st.message()));
    }
    KEEL_RETURN_IF_ERROR(ApplyTomlImpl(text, config_path, &cfg, &given, &toml_foreign, &notes));
  }
  std::vector<Entry> entries;
  std::set<std::string> on_command_line;
  for (size_t i = 0; i < settings.size(); ++i) {
    if (opts[i]->count() == 0) continue;
    entries.push_back({&settings[i], std::make_unique<CliInput>("--" + settings[i].name, raw[i])});
    on_command_line.insert(settings[i].name);
  }
  for (size_t i = 0; i < foreign_flags.size(); ++i) {
    if (fopts[i]->count() == 0) continue;
    const ForeignFlag& f = foreign_flags[i];
    // A switch given as --flag=false is not given.
    if (f.is_flag && CliInput("--" + f.name, fraw[i]).Bool() == false) continue;
    std::string where = "--" + f.name;
    if (!f.is_flag)
      for (const std::string& v : fraw[i]) where += " " + v;
    foreign.push_back({&f, f.is_flag ? std::vector<std::string>{"true"} : fraw[i], where});
  }
  KEEL_RETURN_IF_ERROR(ApplyAliases(&foreign, &entries, on_command_line, &notes));
  KEEL_RETURN_IF_ERROR(ApplyEntries(entries, "command line", "--", &cfg, &given));
  // The --config file's Megatron flags, unless the command line gives the same one.
  for (ForeignGiven& g : toml_foreign) {
    bool overridden = false;
    for (const ForeignGiven& c : foreign) overridden = overridden || c.flag == g.flag;
    if (!overridden) foreign.push_back(std::move(g));
  }
  KEEL_RETURN_IF_ERROR(ReadWeightedSplitPathFiles(given, &cfg));
  int zero_stage = -1;
  for (const ForeignGiven& g : foreign) {
    if (g.flag->name != "zero-stage") continue;
    const auto v = g.values.size() == 1 ? ParseCliInt(g.values[0]) : std::nullopt;
    if (!v || *v < 0 || *v > 3)
      return Status::InvalidArgument(g.where + ": expected a ZeRO stage, 0 to 3");
    zero_stage = static_cast<int>(*v);
  }
  KEEL_RETURN_IF_ERROR(ApplyDeepSpeedConfig(given, &zero_stage, &cfg, &notes));
  KEEL_RETURN_IF_ERROR(ResolveForeignFlags(foreign, given, zero_stage, &cfg, &notes));
  DropDefaultIterWarmup(given, &cfg);
  // pretrain_gpt.py's default tokenizer, resolved here so that the run opening the data (before
  // it validates the config) reads it too; Validate does the same for configs made in code.
  if (cfg.tokenizer_type.empty() && (!cfg.vocab_file.empty() || !cfg.merge_file.empty())) {
    cfg.tokenizer_type = "GPT2BPETokenizer";
    notes.push_back(
        "--tokenizer-type not given: GPT2BPETokenizer, as pretrain_gpt.py defaults it, with "
        "--vocab-file and --merge-file");
  }

  out->as_given = cfg;
  out->config = std::move(cfg);
  return Status::OK();
}

Status ParseTrainArgs(int argc, const char* const* argv, ParsedConfig* out) {
  KEEL_RETURN_IF_ERROR(ReadTrainArgs(argc, argv, out));
  if (out->help_requested) return Status::OK();
  return Validate(&out->config, &out->notes);
}

}  // namespace keel

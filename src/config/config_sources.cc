// Reading a TrainConfig from its two sources: the `keel train` command line (CLI11) and TOML
// files (toml++). Both turn each given value into an Input and hand it to its setting's setter;
// a source's values are applied together so that exclusive pairs can be checked per source.
#include <fmt/format.h>
#include <toml++/toml.h>

#include <CLI/CLI.hpp>
#include <memory>
#include <set>
#include <sstream>
#include <utility>

#include "config/config.h"
#include "config/config_internal.h"
#include "core/env.h"

namespace keel {
namespace {

using config_internal::CheckTomlNonAscii;
using config_internal::FindSetting;
using config_internal::Input;
using config_internal::ParseWhole;
using config_internal::Setting;
using config_internal::Settings;
using config_internal::Suggest;
using config_internal::TomlString;

// ---------------------------------------------------------------------------------------------
// The two kinds of Input: a flag's text values, and a TOML node.

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

}  // namespace

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

}  // namespace keel

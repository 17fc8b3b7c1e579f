// Printing a TrainConfig: every setting as a TOML literal through the settings table, so the
// printed config is itself a loadable --config file, and its hash identifies the run.
#include <fmt/format.h>
#include <xxhash.h>

#include "config/config.h"
#include "config/config_internal.h"

namespace keel {

namespace config_internal {

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

}  // namespace config_internal

using config_internal::Setting;
using config_internal::Settings;

std::string FormatConfig(const TrainConfig& cfg) {
  std::string out;
  for (const Setting& s : Settings()) out += fmt::format("{} = {}\n", s.name, s.get(cfg));
  // Values that are not settings: shown (and hashed) as comments so the text stays loadable.
  out += fmt::format("# data-parallel-size = {}\n", cfg.data_parallel_size);
  out += fmt::format("# vocab-size = {}\n", cfg.model.vocab);
  out += fmt::format("# padded-vocab-size = {}\n", cfg.model.padded_vocab);
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

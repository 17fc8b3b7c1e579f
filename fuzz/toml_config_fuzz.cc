// `keel train --config FILE`: a TOML document over the defaults, then every validation rule and
// the config's text and hash (what the run prints and records).
#include <cstddef>
#include <cstdint>

#include "config/config.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  keel::TrainConfig cfg;
  if (!keel::ApplyToml(keel::fuzz::AsString(data, size), "fuzz.toml", &cfg).ok()) return 0;
  std::vector<std::string> notes;
  if (!keel::Validate(&cfg, &notes).ok()) return 0;
  (void)keel::ConfigHash(cfg);
  (void)keel::FormatConfig(cfg);
  return 0;
}

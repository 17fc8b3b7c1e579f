// A checkpoint's state.json, read through ReadSavedTrainState (every resume, `keel sample`, the
// checkpoint tools). Its config.toml is the default config as a checkpoint writes it.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "config/config.h"
#include "fuzz_input.h"
#include "mem_env.h"
#include "train/train_checkpoint.h"

namespace {

// KNOWN, NOT FIXED HERE (fuzz/regressions/state_json_fuzz/README.md): ReadSavedTrainState throws
// out of its checks on a "format" or "format_version" of the wrong type, and converts JSON numbers
// with a fraction or exponent to integers without a range check (undefined behaviour beyond the
// integer's range). Such inputs are skipped (unless KEEL_FUZZ_UNFILTERED is set) until
// train_checkpoint.cc is fixed; then delete this.
bool HitsKnownBug(const nlohmann::json& j, bool top = true) {
  if (top && j.is_object()) {
    if (j.contains("format") && !j["format"].is_string()) return true;
    if (j.contains("format_version") && !j["format_version"].is_number()) return true;
  }
  if (j.is_number_float()) {
    const double v = j.get<double>();
    return !(std::fabs(v) < 2147483647.0) || v <= -1.0;
  }
  if (j.is_structured())
    for (const auto& e : j)
      if (HitsKnownBug(e, false)) return true;
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string config = [] {
    keel::TrainConfig c;
    std::vector<std::string> notes;
    (void)keel::Validate(&c, &notes);
    return "# resolved config of the run\n" + keel::FormatConfig(c);
  }();
  const std::string text = keel::fuzz::AsString(data, size);
  const auto parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!keel::fuzz::Unfiltered() && !parsed.is_discarded() && HitsKnownBug(parsed)) return 0;
  keel::fuzz::MemEnv env;
  env.Put("/run/iter_0000100/state.json", text);
  env.Put("/run/iter_0000100/config.toml", config);
  keel::SavedTrainState saved;
  (void)keel::ReadSavedTrainState(&env, "/run/iter_0000100", &saved);
  return 0;
}

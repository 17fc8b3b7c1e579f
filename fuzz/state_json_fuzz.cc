// A checkpoint's state.json, read through ReadSavedTrainState (every resume, `keel sample`, the
// checkpoint tools). Its config.toml is the default config as a checkpoint writes it.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/train_checkpoint.h"
#include "config/config.h"
#include "fuzz_input.h"
#include "mem_env.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string config = [] {
    keel::TrainConfig c;
    std::vector<std::string> notes;
    (void)keel::Validate(&c, &notes);
    return "# resolved config of the run\n" + keel::FormatConfig(c);
  }();
  const std::string text = keel::fuzz::AsString(data, size);
  keel::fuzz::MemEnv env;
  env.Put("/run/iter_0000100/state.json", text);
  env.Put("/run/iter_0000100/config.toml", config);
  keel::SavedTrainState saved;
  (void)keel::ReadSavedTrainState(&env, "/run/iter_0000100", &saved);
  return 0;
}

// A DeepSpeed config JSON (--deepspeed --deepspeed_config FILE): parsed on its own, then applied
// to the flags of a run through ParseTrainArgs (which validates the result).
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/deepspeed_config.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = keel::fuzz::AsString(data, size);
  keel::DeepSpeedConfig ds;
  if (!keel::ParseDeepSpeedConfig(text, "ds.json", &ds).ok()) return 0;
  const std::string path = keel::fuzz::ScratchDir() + "/ds_config.json";
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  const std::vector<std::string> args = {"train", "--deepspeed",  "--deepspeed_config",
                                         path,    "--fp16",       "--loss-scale",
                                         "12",    "--zero-stage", "1"};
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  keel::ParsedConfig parsed;
  (void)keel::ParseTrainArgs(static_cast<int>(argv.size()), argv.data(), &parsed);
  return 0;
}

// `keel train FLAGS`: the input is the argument list, one argument per line.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = keel::fuzz::AsString(data, size);
  std::vector<std::string> args = {"train"};
  for (size_t start = 0; start <= text.size();) {
    size_t nl = text.find('\n', start);
    if (nl == std::string::npos) nl = text.size();
    args.push_back(text.substr(start, nl - start));
    start = nl + 1;
  }
  // --config names a file to read; the TOML itself is toml_config_fuzz's. Reading whatever path
  // the fuzzer spells (/dev/zero, a FIFO) would only test the operating system.
  for (const std::string& a : args)
    if (a.find("-config") != std::string::npos) return 0;
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  keel::ParsedConfig parsed;
  (void)keel::ParseTrainArgs(static_cast<int>(argv.size()), argv.data(), &parsed);
  return 0;
}

// One line of `keel data prepare`'s loose JSON input (Megatron's preprocess_data.py format):
// the texts of the keys, or an error naming the line.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "data/prepare.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string line = keel::fuzz::AsString(data, size);
  std::vector<std::string> texts;
  for (const std::vector<std::string>& keys :
       {std::vector<std::string>{"text"}, std::vector<std::string>{"text", "title", ""}}) {
    const keel::Status st = keel::ExtractJsonDocument(line, keys, "in.jsonl:1", &texts);
    if (st.ok() && texts.size() != keys.size()) __builtin_trap();
    // "invalid UTF-8" only for a line that is not UTF-8: a parser that accepts it would be wrong.
    if (st.ok() && st.message().find("invalid UTF-8") != std::string::npos) __builtin_trap();
  }
  return 0;
}

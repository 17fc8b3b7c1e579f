// A Hugging Face tokenizer folder (--tokenizer-type PretrainedFromHF): tokenizer.json,
// tokenizer_config.json and a text, the input's three parts (see fuzz_input.h). A tokenizer that
// loads must encode the text, keep its ids inside its vocabulary, and decode any ids.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "data/tokenizer.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = keel::fuzz::SplitInput(data, size, 3);
  std::unique_ptr<keel::Tokenizer> tok;
  if (!keel::ParseHfTokenizer(parts[0], parts[1], "", "tokenizer.json", &tok).ok()) return 0;
  const auto ids = tok->Encode(parts[2]);
  for (int32_t id : ids)
    if (id < 0 || id >= tok->VocabSize()) __builtin_trap();
  if (tok->EodId() < 0 || tok->EodId() >= tok->VocabSize()) __builtin_trap();
  (void)tok->Decode(ids);
  (void)tok->Decode({-1, tok->EodId(), tok->VocabSize(), 1 << 30});
  return 0;
}

// GPT-2 BPE files (encoder.json, vocab.bpe) and text: the input's three parts (see fuzz_input.h).
// A vocabulary that loads must then encode the text and decode it back.
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>

#include "data/tokenizer.h"
#include "fuzz_input.h"

namespace {

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = keel::fuzz::SplitInput(data, size, 3);
  const std::string encoder = keel::fuzz::ScratchDir() + "/encoder.json";
  const std::string merges = keel::fuzz::ScratchDir() + "/vocab.bpe";
  WriteFile(encoder, parts[0]);
  WriteFile(merges, parts[1]);
  std::unique_ptr<keel::Tokenizer> tok;
  if (!keel::LoadGpt2Tokenizer(encoder, merges, &tok).ok()) return 0;
  const auto ids = tok->Encode(parts[2]);
  // Byte-level BPE is lossless: every byte has a token, so decoding gives the text back.
  if (tok->Decode(ids) != parts[2]) __builtin_trap();
  (void)tok->Decode({-1, tok->EodId(), tok->VocabSize(), 1 << 30});
  return 0;
}

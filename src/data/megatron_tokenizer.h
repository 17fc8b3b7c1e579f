// The tokenizer Megatron's flags name: --tokenizer-type GPT2BPETokenizer with --vocab-file and
// --merge-file, SentencePieceTokenizer with --tokenizer-model, or PretrainedFromHF with
// --tokenizer-name-or-path (a local Hugging Face tokenizer folder). `keel train` reads datasets
// that Megatron's tools wrote (no keel metadata) with it, and `keel data prepare` takes the same
// flags as Megatron's tools/preprocess_data.py.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/env.h"
#include "core/status.h"
#include "data/indexed_dataset.h"
#include "data/tokenizer.h"

namespace keel {

struct TokenizerSpec {
  std::string type;  // GPT2BPETokenizer | SentencePieceTokenizer | PretrainedFromHF; "": none
  std::string vocab_file, merge_file;  // GPT2BPETokenizer
  std::string tokenizer_model;         // SentencePieceTokenizer
  std::string name_or_path;            // PretrainedFromHF
  bool given() const { return !type.empty(); }
};

// The --tokenizer-type values keel reads, as Megatron spells them.
const std::vector<std::string>& MegatronTokenizerTypes();

// Loads the tokenizer of `spec`. InvalidArgument naming the flag and the file when one is missing
// or unreadable. `notes` gets what keel chose on the user's behalf (the EOD piece of a
// SentencePiece model keel did not train).
Status LoadTokenizerFromSpec(Env* env, const TokenizerSpec& spec, std::unique_ptr<Tokenizer>* tok,
                             std::vector<std::string>* notes);

// What a dataset tokenized with `spec` records in its metadata (and a checkpoint in its state):
// the tokenizer's kind, vocabulary and EOD, and its files as absolute paths.
DatasetMeta MetaForSpec(const TokenizerSpec& spec, const Tokenizer& tok);

// "--tokenizer-type GPT2BPETokenizer --vocab-file F --merge-file G", for messages.
std::string DescribeSpec(const TokenizerSpec& spec);

}  // namespace keel

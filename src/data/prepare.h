// Dataset preparation (`keel data prepare`): text -> tokenizer -> Megatron indexed dataset. Two
// modes: keel's (text files, one document each, the tokenizer's EOD after every document), and
// Megatron's tools/preprocess_data.py's, chosen by a --tokenizer-type (loose JSON input, one
// object per line, each of --json-keys its own dataset PREFIX_KEY_document, the EOD only with
// --append-eod, documents that tokenize to nothing skipped).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/env.h"
#include "core/status.h"
#include "data/indexed_dataset.h"
#include "data/megatron_tokenizer.h"
#include "data/tokenizer.h"

namespace keel {

struct PrepareOptions {
  std::vector<std::string> inputs;  // text files, one document each, in this order
  std::string output_prefix;        // writes PREFIX.bin, .idx, .meta.json (+ .model, .vocab)
  std::string tokenizer = "sentencepiece";  // "gpt2" | "sentencepiece"
  int vocab_size = 4096;                    // sentencepiece only: trained vocabulary size
  // sentencepiece only: use this trained model (another dataset's PREFIX.model) instead of
  // training one, so datasets share a vocabulary and can be mixed. Copied to PREFIX.model.
  std::string tokenizer_model;
  std::string gpt2_assets_dir;  // gpt2 only; empty: DefaultGpt2AssetsDir()
  uint64_t seed = 1234;         // sentencepiece training seed
  bool progress = false;        // progress bar on stderr
  int workers = 0;              // threads tokenizing in parallel; 0: all cores
  // Megatron's mode: the tokenizer of --tokenizer-type and its files; the inputs are loose JSON.
  TokenizerSpec megatron;
  std::vector<std::string> json_keys{"text"};
  bool append_eod = false;
  // Write a dataset even when the input holds no document (no text in keel's mode, no JSON
  // line in Megatron's, or every document tokenized to nothing): refused otherwise, as an empty
  // dataset is almost always a wrong input (an empty file, a pipe read as nothing).
  bool allow_empty = false;
};

struct PrepareStats {
  int64_t documents = 0;
  int64_t bytes = 0;          // input text
  int64_t tokens = 0;         // including the EODs
  int64_t empty_skipped = 0;  // Megatron's mode: documents that tokenized to nothing
  int vocab_size = 0;
  int workers = 0;                   // threads that tokenized
  double tokenizer_seconds = 0;      // loading or training the tokenizer
  double seconds = 0;                // the whole preparation
  double encode_seconds = 0;         // reading, tokenizing and writing (after the tokenizer)
  std::vector<std::string> outputs;  // the prefixes written
  std::vector<std::string> notes;    // what keel chose on the user's behalf
};

Status PrepareDataset(Env* env, const PrepareOptions& options, PrepareStats* stats);

// The longest line of loose JSON input (one document) keel reads: a longer one is refused by name.
inline constexpr size_t kMaxJsonLineBytes = size_t{256} << 20;

// The inputs of a preparation are read with read(2) in pieces (Env::ReadFileRange), never
// mapped: a file truncated while it is read is an error naming it, not a SIGBUS. Only regular
// files: a FIFO, device or socket (a shell's <(...)) is refused by name before anything is read.

// One line of loose JSON input: the text of each of `keys` (Megatron's preprocess_data.py reads
// data[key] of json.loads(line)). InvalidArgument naming `where` (FILE:LINE) and the key, or the
// byte offset of the first byte that is not UTF-8 (JSON text is UTF-8).
Status ExtractJsonDocument(std::string_view line, const std::vector<std::string>& keys,
                           const std::string& where, std::vector<std::string>* texts);

// Opens the tokenizer that `meta` (of the dataset at `prefix`) names: gpt2 from the npm assets,
// sentencepiece from the model file next to the dataset.
// The sentencepiece model file `meta` names, resolved against the dataset's directory.
std::string TokenizerModelPath(const std::string& prefix, const DatasetMeta& meta);

Status LoadTokenizerForDataset(const std::string& prefix, const DatasetMeta& meta,
                               std::unique_ptr<Tokenizer>* out);

}  // namespace keel

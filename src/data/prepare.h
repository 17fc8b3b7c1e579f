// Dataset preparation (`keel data prepare`): text files -> tokenizer -> Megatron indexed dataset.
// Each input file is one document; the tokenizer's EOD id follows every document.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/env.h"
#include "core/status.h"
#include "data/indexed_dataset.h"
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
};

struct PrepareStats {
  int64_t documents = 0;
  int64_t bytes = 0;   // input text
  int64_t tokens = 0;  // including one EOD per document
  int vocab_size = 0;
  double tokenizer_seconds = 0;  // loading or training the tokenizer
  double seconds = 0;            // the whole preparation
};

Status PrepareDataset(Env* env, const PrepareOptions& options, PrepareStats* stats);

// Opens the tokenizer that `meta` (of the dataset at `prefix`) names: gpt2 from the npm assets,
// sentencepiece from the model file next to the dataset.
// The sentencepiece model file `meta` names, resolved against the dataset's directory.
std::string TokenizerModelPath(const std::string& prefix, const DatasetMeta& meta);

Status LoadTokenizerForDataset(const std::string& prefix, const DatasetMeta& meta,
                               std::unique_ptr<Tokenizer>* out);

}  // namespace keel

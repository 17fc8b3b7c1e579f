// The Hugging Face architectures a keel model is exported as and imported from
// (docs/hugging-face.md): which one represents a GptSpec, and one table per architecture that says
// where every HF tensor comes from in keel's tensors and how its layout changes. Export and import
// read the same table (each layout change has its inverse), so a round trip gives the same bits by
// construction.
//
//   GPT-2  learned positions, LayerNorm, GELU (tanh), tied or untied head; Conv1D [in, out] weights
//   Llama  RoPE (rotate-half, as keel), RMSNorm, SwiGLU, grouped-query attention, optional biases;
//          the fused QKV and gate|up weights are cut into q/k/v_proj and gate/up_proj by rows
//   BLOOM  ALiBi, LayerNorm after the word embedding, LayerNorm, GELU (tanh), FFN 4h, tied head;
//          the fused QKV rows are interleaved per head ([q_h | k_h | v_h] for each head h)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/gpt.h"

namespace keel {

enum class HfArch { kGpt2, kLlama, kBloom };

// config.json's model_type: "gpt2", "llama", "bloom".
const char* HfModelType(HfArch arch);
// The transformers class that loads the folder: GPT2LMHeadModel, LlamaForCausalLM,
// BloomForCausalLM.
const char* HfModelClass(HfArch arch);
// "GPT-2", "Llama", "BLOOM".
const char* HfArchTitle(HfArch arch);

// The architecture that represents `spec`, picked by its position scheme (learned: GPT-2, RoPE:
// Llama, ALiBi: BLOOM). InvalidArgument naming the first feature that architecture cannot
// represent and what keel exports when there is none.
Status HfArchForSpec(const GptSpec& spec, HfArch* arch);

// How an HF tensor is laid out against the keel tensor it comes from.
enum class HfLayout {
  kRows,        // rows [row_begin, row_begin + hf rows) of the keel tensor, as they are
  kTransposed,  // the keel [out, in] matrix transposed (GPT-2's Conv1D weights are [in, out])
  kBloomQkv,    // keel's fused QKV rows [q | k | v] reordered per head: [q_0 k_0 v_0 | q_1 ...]
};

// One HF tensor and its source. A 1-D tensor counts as rows of one value.
struct HfTensorMapping {
  std::string hf_name;
  std::vector<int64_t> hf_shape;
  std::string keel_name;
  std::vector<int64_t> keel_shape;
  HfLayout layout = HfLayout::kRows;
  int64_t row_begin = 0;  // kRows: the first keel row
  int64_t heads = 0;      // kBloomQkv: attention heads (each of hs = rows / (3 * heads) rows)
  // The HF tensor is exactly the keel tensor's memory (kRows): an export can write it in place.
  bool InPlace() const { return layout == HfLayout::kRows; }
};

// Every HF tensor of `arch` for `spec` (which HfArchForSpec accepted), in HF's registration order.
// HF names carry the prefix of the published checkpoints: none for GPT-2 and BLOOM ("wte.weight",
// "h.0.ln_1.weight"), "model." for Llama ("model.layers.0.self_attn.q_proj.weight").
std::vector<HfTensorMapping> HfTensorMappings(HfArch arch, const GptSpec& spec);

// Layout changes. `keel` is the whole keel tensor, `hf` the whole HF tensor (fp32, row-major).
// KeelToHf fills `hf` from `keel`; HfToKeel writes the part of `keel` the mapping covers.
void KeelToHf(const HfTensorMapping& m, const float* keel, float* hf);
void HfToKeel(const HfTensorMapping& m, const float* hf, float* keel);
// For InPlace() mappings: where the HF tensor starts inside the keel tensor.
const float* HfViewOf(const HfTensorMapping& m, const float* keel);

int64_t NumElements(const std::vector<int64_t>& shape);

}  // namespace keel

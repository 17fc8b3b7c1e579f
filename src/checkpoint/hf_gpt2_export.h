// Export of a keel checkpoint as a Hugging Face GPT-2 folder (docs/hf-export.md): config.json,
// model.safetensors with HF names in Conv1D [in, out] layout, and the GPT-2 tokenizer files when
// the checkpoint used the gpt2 tokenizer. transformers' GPT2LMHeadModel loads the folder and gives
// keel's logits for the real vocabulary.
//
//   keel                                            HF GPT-2 (Conv1D weights are [in, out])
//   embedding.word_embeddings.weight   [Vp, C]      wte.weight          [V, C] (first V rows)
//   embedding.position_embeddings.weight [P, C]     wpe.weight          [P, C]
//   layers.N.input_layernorm.{weight,bias}          h.N.ln_1.{weight,bias}
//   layers.N.attention.query_key_value.weight [3C,C] h.N.attn.c_attn.weight [C, 3C] (transposed)
//   layers.N.attention.dense.weight    [C, C]       h.N.attn.c_proj.weight [C, C] (transposed)
//   layers.N.post_attention_layernorm.*             h.N.ln_2.*
//   layers.N.mlp.dense_h_to_4h.weight  [F, C]       h.N.mlp.c_fc.weight    [C, F] (transposed)
//   layers.N.mlp.dense_4h_to_h.weight  [C, F]       h.N.mlp.c_proj.weight  [F, C] (transposed)
//   final_layernorm.{weight,bias}                   ln_f.{weight,bias}
//
// keel's fused QKV output rows are already [q (all heads) | k | v] with head h at h*hs..(h+1)*hs
// of each block (Backend::AttentionForward), which is how HF splits c_attn's output columns, so
// the conversion is a plain transpose. Q and K are each pre-scaled by hs^-1/4 in keel, the same as
// HF's scale_attn_weights (scores / sqrt(hs)); keel's GELU is the tanh approximation (gelu_new).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_store.h"
#include "checkpoint/safetensors.h"
#include "core/env.h"
#include "core/status.h"
#include "model/gpt.h"

namespace keel {

// InvalidArgument naming the feature when HF GPT-2 cannot represent `spec` (ALiBi, a LayerNorm
// after the embedding); OK otherwise.
Status CheckHfGpt2Compatible(const GptSpec& spec);

// config.json for `spec` (see the .cc for every field); `eod_id` becomes bos and eos.
nlohmann::ordered_json HfGpt2Config(const GptSpec& spec, int32_t eod_id);

// The HF tensors of a model whose keel tensors `keel` holds (host fp32, by keel name with keel
// shapes). Transposed copies live in `storage`, which must outlive the returned views; the other
// views point into `keel`'s memory. Errors name a missing tensor or a wrong shape.
Status ConvertToHfGpt2(const GptSpec& spec, const std::map<std::string, TensorView>& keel,
                       std::vector<std::vector<float>>* storage, std::vector<TensorView>* out);

struct HfExportOptions {
  std::string gpt2_assets_dir;  // encoder.json and vocab.bpe; empty: DefaultGpt2AssetsDir()
};

struct HfExportReport {
  std::string checkpoint_dir;  // the iter_N directory that was exported
  std::string out_dir;
  std::vector<std::pair<std::string, uint64_t>> files;  // name inside out_dir, bytes
  size_t num_tensors = 0;
  int vocab = 0;         // V, rows of wte.weight and config vocab_size
  int padded_vocab = 0;  // keel's Vp, sliced to V
  std::string tokenizer_kind;
  bool wrote_tokenizer = false;
  std::string tokenizer_note;  // why no tokenizer files were written, when none were
};

// Exports `checkpoint_path` (an iter_N directory, or a run directory: its newest valid checkpoint)
// to `out_dir`, written as `out_dir`.tmp and renamed into place. InvalidArgument (nothing written)
// when the model is not representable, when `out_dir` exists and is not an empty directory, or
// when `out_dir`.tmp exists (an interrupted export: remove it).
Status ExportHfGpt2(Env* env, const std::string& checkpoint_path, const std::string& out_dir,
                    const HfExportOptions& options, const CheckpointStore::Logger& log,
                    HfExportReport* report);

}  // namespace keel

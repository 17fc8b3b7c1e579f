// The model families the tests build at toy sizes (tests/model, tests/checkpoint): every tensor
// kind keel cuts across ranks, each test choosing the sizes its layouts need.
#pragma once

#include "config/model_shape.h"

namespace keel::test_shapes {

struct Sizes {
  int layers = 2;
  int hidden = 32;
  int vocab = 61;
  int padded_vocab = 64;  // above vocab: the last vocabulary slice holds padding rows
};

// GPT-2's shape: learned positions, LayerNorm, GELU, biases, tied output layer; 4 heads.
inline GptSpec Gpt2(const Sizes& z) {
  GptSpec s;
  s.num_layers = z.layers;
  s.hidden = z.hidden;
  s.heads = 4;
  s.ffn_hidden = 128;
  s.max_positions = 16;
  s.vocab = z.vocab;
  s.padded_vocab = z.padded_vocab;
  return s;
}

// Llama's: RoPE, RMSNorm, SwiGLU, grouped-query attention (4 key/value groups for 8 heads), no
// biases, untied output layer.
inline GptSpec Llama(const Sizes& z) {
  GptSpec s = Gpt2(z);
  s.heads = 8;
  s.SetKvHeads(4);
  s.ffn_hidden = 96;
  s.rope = true;
  s.rmsnorm = true;
  s.swiglu = true;
  s.bias = false;
  s.untie_embeddings = true;
  return s;
}

// BLOOM-ish: ALiBi (slopes by global head index), embedding LayerNorm, plus QK-LayerNorm (its
// weights are shared by heads on every rank) and z-loss.
inline GptSpec Bloom(const Sizes& z) {
  GptSpec s = Gpt2(z);
  s.alibi = true;
  s.embed_layernorm = true;
  s.qk_layernorm = true;
  s.z_loss = 1e-3;
  return s;
}

}  // namespace keel::test_shapes

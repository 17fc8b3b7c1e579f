// The model's memory as a run estimates it before allocating (train/memory_estimate.h):
// ParamCount is ParamLayout's total for every shape option and counts a billion layers without
// allocating them; ActivationBytes is what the first Forward of that shape really allocates.
#include <gtest/gtest.h>
#include <malloc.h>

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/gpt.h"

namespace keel {
namespace {

GptSpec Spec(int layers, bool alibi, bool embed_ln, bool qk_ln) {
  GptSpec s{layers, 64, 192, 4, 32, 500, 512, alibi, embed_ln, 1e-5f};
  s.qk_layernorm = qk_ln;
  return s;
}

// The Llama family's options on the same shape: RoPE, RMSNorm (no means kept), SwiGLU (a 2F-wide
// first product), 2 key/value heads (a narrower QKV), untied output, no biases.
GptSpec Llama(int layers, bool qk_ln) {
  GptSpec s = Spec(layers, false, false, qk_ln);
  s.rope = s.rmsnorm = s.swiglu = s.untie_embeddings = true;
  s.SetKvHeads(2);
  s.bias = false;
  return s;
}

TEST(GptMemoryTest, ParamCountIsTheLayoutsTotalForEveryShapeOption) {
  std::unique_ptr<Backend> be = MakeCpuBackend(1);
  for (int layers : {1, 3}) {
    for (bool alibi : {false, true}) {
      for (bool qk : {false, true}) {
        for (const GptSpec& s : {Spec(layers, alibi, !alibi, qk), Llama(layers, qk)}) {
          uint64_t total = 0;
          for (const ParamInfo& p : GptModel::ParamLayout(s)) total += p.numel;
          EXPECT_EQ(GptModel::ParamCount(s), total) << layers << alibi << qk;
          EXPECT_EQ(GptModel(be.get(), s).num_params(), total);
        }
      }
    }
  }
}

TEST(GptMemoryTest, ABillionLayersAreCountedNotAllocated) {
  GptSpec s{1 << 30, 32, 128, 2, 32, 4096, 4096, false, false, 1e-5f};
  // The seeds' formula is exact for this shape; listing 2^30 layers' tensors would take ~1 TB.
  EXPECT_EQ(static_cast<int64_t>(GptModel::ParamCount(s)), GptModel::FormulaParamCount(s));
  EXPECT_GT(GptModel::ActivationBytes(s, 2, 32), (uint64_t{1} << 30) * 2 * 32 * 32 * 4);
}

// Bytes the process holds from malloc (arenas and mmapped chunks).
size_t HeapBytes() {
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

TEST(GptMemoryTest, ActivationBytesIsWhatTheFirstForwardAllocates) {
#if defined(KEEL_SANITIZED_BUILD)
  GTEST_SKIP() << "AddressSanitizer replaces malloc, so mallinfo2 counts nothing; the Release "
                  "suite runs this test";
#endif
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    std::unique_ptr<Backend> be = MakeCpuBackend(1);
    be->SetPrecision(p);
    for (int shape = 0; shape < 3; ++shape) {
      const bool qk = shape == 1;
      const GptSpec s = shape < 2 ? Spec(3, false, false, qk) : Llama(3, true);
      const int B = 4, T = 32;
      GptModel m(be.get(), s);
      m.Initialize(1, 0.02f);
      std::vector<int32_t> tokens(B * T), targets(B * T);
      for (int i = 0; i < B * T; ++i) tokens[i] = targets[i] = i % s.vocab;
      if (p != Precision::kFp32) {
        // The backend's own scratch (the products' 16-bit operands, oneDNN's scratchpad) is
        // made by its first products; measure the model's buffers alone.
        GptModel warm(be.get(), s);
        warm.Forward(tokens.data(), targets.data(), B, T, 1.0f);
        warm.Backward();
      }
      const size_t before = HeapBytes();
      m.Forward(tokens.data(), targets.data(), B, T, 1.0f);
      // bf16: the first Forward also makes the weights' 16-bit copy (not an activation).
      const size_t weights_copy = p == Precision::kFp32 ? 0 : m.num_params() * sizeof(uint16_t);
      const double allocated = static_cast<double>(HeapBytes() - before - weights_copy);
      const double counted = static_cast<double>(GptModel::ActivationBytes(s, B, T, p));
      ASSERT_GT(counted, 1e6);
      if (p != Precision::kFp32) {
        EXPECT_GT(counted, GptModel::ActivationBytes(s, B, T) * 1.1);
      }
      // Allowance: 64-byte rounding and malloc headers of ~90 buffers, the kernels' scratch rows.
      EXPECT_NEAR(allocated, counted, 0.01 * counted + 64 * 1024)
          << "shape " << shape << " " << PrecisionName(p);
    }
  }
}

// Recomputation's buffers: what the first Forward allocates, and less of it. Full keeps each
// layer's input only, so its activations grow by one residual stream per layer; selective keeps
// one layer's attention probabilities.
TEST(GptMemoryTest, RecomputationAllocatesWhatItCountsAndLess) {
#if defined(KEEL_SANITIZED_BUILD)
  GTEST_SKIP() << "AddressSanitizer replaces malloc, so mallinfo2 counts nothing; the Release "
                  "suite runs this test";
#endif
  const GptSpec s = Llama(4, true);
  const int B = 4, T = 32;
  uint64_t counted[3];
  std::unique_ptr<Backend> be = MakeCpuBackend(1);
  // The heap bytes the first Forward of a model recomputing so allocates.
  auto allocated_by_forward = [&](Recompute r, int full_layers) {
    GptModel m(be.get(), s);
    m.set_recompute(r, full_layers);
    m.Initialize(1, 0.02f);
    std::vector<int32_t> tokens(B * T), targets(B * T);
    for (int i = 0; i < B * T; ++i) tokens[i] = targets[i] = i % s.vocab;
    const size_t before = HeapBytes();
    m.Forward(tokens.data(), targets.data(), B, T, 1.0f);
    return static_cast<double>(HeapBytes() - before);
  };
  for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    const double allocated = allocated_by_forward(r, -1);
    counted[static_cast<int>(r)] = GptModel::ActivationBytes(s, B, T, Precision::kFp32, r);
    const double c = static_cast<double>(counted[static_cast<int>(r)]);
    EXPECT_NEAR(allocated, c, 0.01 * c + 64 * 1024) << RecomputeName(r);
  }
  const uint64_t att = uint64_t{B} * s.heads * T * T * sizeof(float);
  EXPECT_EQ(counted[0] - counted[1], 3 * att);  // four layers' probabilities become one
  EXPECT_LT(counted[2], counted[1]);
  // Full: one layer's buffers, plus every layer's input and guard signal.
  const uint64_t one =
      GptModel::ActivationBytes(s, B, T, Precision::kFp32, Recompute::kNone) -
      GptModel::ActivationBytes(Llama(3, true), B, T, Precision::kFp32, Recompute::kNone);
  const uint64_t kept = uint64_t{B} * T * s.hidden * sizeof(float) + B * s.heads * sizeof(float);
  EXPECT_EQ(counted[0] - counted[2], 3 * (one - kept));
  // --recompute-method block 2: layer 1 shares layer 0's buffers, layers 2 and 3 keep their own.
  const double allocated = allocated_by_forward(Recompute::kFull, 2);
  const uint64_t block = GptModel::ActivationBytes(s, B, T, Precision::kFp32, Recompute::kFull, 2);
  EXPECT_NEAR(allocated, static_cast<double>(block), 0.01 * block + 64 * 1024);
  EXPECT_EQ(counted[0] - block, one - kept);
  // And its 16-bit matmul inputs: three layers' slots instead of four (bf16).
  EXPECT_EQ(GptModel::ActivationBytes(s, B, T, Precision::kBf16, Recompute::kFull, 2) - block,
            GptModel::ActivationBytes(s, B, T, Precision::kBf16, Recompute::kNone) - counted[0] -
                uint64_t{B} * T * (3 * s.hidden + s.ffn_hidden) * sizeof(uint16_t));
}

}  // namespace
}  // namespace keel

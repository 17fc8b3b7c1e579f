// --qk-layernorm-epsilon reaches QK-LayerNorm: another epsilon changes the model's output, and
// the default (0: the LayerNorm epsilon) computes the same bits as an explicit equal one, so the
// runs from before the setting keep their bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "backend/registry.h"
#include "model/gpt.h"

namespace keel {
namespace {

// Logits of one forward of a small QK-LayerNorm model with weights from seed 5.
std::vector<float> Logits(float qk_eps) {
  GptSpec s{2, 16, 64, 2, 8, 13, 16, false, false, 1e-5f};
  s.qk_layernorm = true;
  s.qk_layernorm_eps = qk_eps;
  std::unique_ptr<Backend> be;
  EXPECT_TRUE(MakeBackend("cpu", 1, &be).ok());
  GptModel model(be.get(), s);
  model.Initialize(5, 0.3f);
  const int B = 2, T = 8;
  std::vector<int32_t> tok(B * T);
  for (int i = 0; i < B * T; ++i) tok[i] = (i * 7 + 3) % s.vocab;
  model.Forward(tok.data(), nullptr, B, T, 0.0f);
  std::vector<float> out;
  for (int i = 0; i < B * T; ++i) {
    const std::vector<float> row = model.LogitsAt(i / T, i % T);
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

TEST(QkLayerNormEpsilonTest, TheEpsilonChangesTheOutputAndItsDefaultIsTheLayerNormOne) {
  const std::vector<float> follows = Logits(0);
  EXPECT_EQ(Logits(1e-5f), follows);  // bit for bit: the same epsilon
  // A large epsilon damps the normalised queries and keys: the logits move.
  const std::vector<float> damped = Logits(1.0f);
  ASSERT_EQ(damped.size(), follows.size());
  double diff = 0;
  for (size_t i = 0; i < follows.size(); ++i)
    diff = std::max<double>(diff, std::abs(damped[i] - follows[i]));
  EXPECT_GT(diff, 1e-4);
}

}  // namespace
}  // namespace keel

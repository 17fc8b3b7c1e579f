// CheckBackendSupports: a backend that lacks an op a config needs is refused naming the op and
// the setting (ggml's supports_op), and one that lacks an op the config does not use is not.
#include <gtest/gtest.h>

#include "../backend/test_backends.h"
#include "model/gpt.h"

namespace keel {
namespace {

using testing_backends::LackingBackend;

GptSpec Gpt2() {
  GptSpec s;
  s.num_layers = 1, s.hidden = 32, s.ffn_hidden = 128, s.heads = 4, s.max_positions = 16;
  s.vocab = 50, s.padded_vocab = 128;
  return s;
}

GptSpec Llama() {
  GptSpec s = Gpt2();
  s.rope = s.rmsnorm = s.swiglu = true;
  s.bias = false;
  return s;
}

TEST(GptModelBackendSupportTest, TheCpuBackendRunsEveryShapeInEveryPrecision) {
  std::unique_ptr<Backend> be = MakeCpuBackend(1);
  for (const GptSpec& spec : {Gpt2(), Llama()})
    for (Precision p : {Precision::kFp32, Precision::kBf16, Precision::kFp16})
      EXPECT_TRUE(CheckBackendSupports(*be, spec, p).ok());
}

TEST(GptModelBackendSupportTest, AMissingOpIsNamedWithTheSettingThatNeedsIt) {
  LackingBackend be(MakeCpuBackend(1), Op::kRopeForward);
  EXPECT_TRUE(CheckBackendSupports(be, Gpt2(), Precision::kFp32).ok());  // learned positions
  const Status st = CheckBackendSupports(be, Llama(), Precision::kFp32);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "backend lacking lacks RopeForward, needed by --position-embedding-type rope");

  LackingBackend no_swiglu(MakeCpuBackend(1), Op::kSwigluBackward);
  EXPECT_TRUE(CheckBackendSupports(no_swiglu, Gpt2(), Precision::kFp32).ok());
  EXPECT_EQ(CheckBackendSupports(no_swiglu, Llama(), Precision::kBf16).message(),
            "backend lacking lacks SwigluBackward, needed by --swiglu");

  LackingBackend no_adamw(MakeCpuBackend(1), Op::kAdamWUpdate);
  EXPECT_EQ(CheckBackendSupports(no_adamw, Gpt2(), Precision::kFp32).message(),
            "backend lacking lacks AdamWUpdate, needed by every model");
}

TEST(GptModelBackendSupportTest, AnOpMissingInOnePrecisionBlamesThePrecisionFlag) {
  LackingBackend be(MakeCpuBackend(1), Op::kMatmulForward, /*only_low_precision=*/true);
  EXPECT_TRUE(CheckBackendSupports(be, Gpt2(), Precision::kFp32).ok());
  EXPECT_EQ(CheckBackendSupports(be, Gpt2(), Precision::kBf16).message(),
            "backend lacking lacks MatmulForward in bf16, needed by --bf16");
  EXPECT_EQ(CheckBackendSupports(be, Gpt2(), Precision::kFp16).message(),
            "backend lacking lacks MatmulForward in fp16, needed by --fp16");
}

}  // namespace
}  // namespace keel

#include "backend/backend.h"

#include <fmt/format.h>

#include "core/status.h"

namespace keel {

const char* OpName(Op op) {
  switch (op) {
    case Op::kToLowPrecision:
      return "ToLowPrecision";
    case Op::kRoundToStorage:
      return "RoundToStorage";
    case Op::kEmbeddingForward:
      return "EmbeddingForward";
    case Op::kEmbeddingBackward:
      return "EmbeddingBackward";
    case Op::kLayerNormForward:
      return "LayerNormForward";
    case Op::kLayerNormBackward:
      return "LayerNormBackward";
    case Op::kRmsNormForward:
      return "RmsNormForward";
    case Op::kRmsNormBackward:
      return "RmsNormBackward";
    case Op::kMatmulForward:
      return "MatmulForward";
    case Op::kMatmulBackward:
      return "MatmulBackward";
    case Op::kAttentionForward:
      return "AttentionForward";
    case Op::kAttentionBackward:
      return "AttentionBackward";
    case Op::kQkLayerNormForward:
      return "QkLayerNormForward";
    case Op::kQkLayerNormBackward:
      return "QkLayerNormBackward";
    case Op::kRopeForward:
      return "RopeForward";
    case Op::kRopeBackward:
      return "RopeBackward";
    case Op::kGeluForward:
      return "GeluForward";
    case Op::kGeluBackward:
      return "GeluBackward";
    case Op::kSwigluForward:
      return "SwigluForward";
    case Op::kSwigluBackward:
      return "SwigluBackward";
    case Op::kAdd:
      return "Add";
    case Op::kAccumulate:
      return "Accumulate";
    case Op::kScale:
      return "Scale";
    case Op::kCrossEntropyForwardBackward:
      return "CrossEntropyForwardBackward";
    case Op::kSoftmax:
      return "Softmax";
    case Op::kSumSquaresAndZeros:
      return "SumSquaresAndZeros";
    case Op::kCountNonFinite:
      return "CountNonFinite";
    case Op::kAdamWUpdate:
      return "AdamWUpdate";
    case Op::kVocabParallelEmbeddingForward:
      return "VocabParallelEmbeddingForward";
    case Op::kVocabParallelEmbeddingBackward:
      return "VocabParallelEmbeddingBackward";
    case Op::kVocabParallelMax:
      return "VocabParallelMax";
    case Op::kVocabParallelSumExp:
      return "VocabParallelSumExp";
    case Op::kVocabParallelCrossEntropyBackward:
      return "VocabParallelCrossEntropyBackward";
  }
  return "?";
}

namespace {

[[noreturn]] void Lacks(const Backend& be, Op op) {
  throw KeelError(Status::Internal(fmt::format(
      "backend {} does not implement {} (its Supports says so; CheckBackendSupports refuses the "
      "run before it gets here)",
      be.Name(), OpName(op))));
}

}  // namespace

void Backend::VocabParallelEmbeddingForward(float*, const int32_t*, const float*, const float*, int,
                                            int, int, int, int, int, const int32_t*) {
  Lacks(*this, Op::kVocabParallelEmbeddingForward);
}
void Backend::VocabParallelEmbeddingBackward(float*, float*, const float*, const int32_t*, int, int,
                                             int, int, int, int, const int32_t*) {
  Lacks(*this, Op::kVocabParallelEmbeddingBackward);
}
void Backend::VocabParallelMax(float*, const float*, int, int, int, int) {
  Lacks(*this, Op::kVocabParallelMax);
}
void Backend::VocabParallelSumExp(float*, float*, const float*, const int32_t*, int, int, int,
                                  int) {
  Lacks(*this, Op::kVocabParallelSumExp);
}
void Backend::VocabParallelCrossEntropyBackward(float*, float*, float*, const float*, const float*,
                                                const int32_t*, int, int, int, int, float, float) {
  Lacks(*this, Op::kVocabParallelCrossEntropyBackward);
}

}  // namespace keel

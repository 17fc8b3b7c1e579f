#include "backend/backend.h"

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
  }
  return "?";
}

}  // namespace keel

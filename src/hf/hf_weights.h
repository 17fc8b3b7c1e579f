// The weights of a Hugging Face folder, for an import: model.safetensors, or the shards that
// model.safetensors.index.json names, each mapped read-only, read by tensor name and converted to
// fp32 exactly (F32 as it is, F16 and BF16 widened: every value of those is an fp32 value).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "core/env.h"
#include "core/status.h"

namespace keel {

constexpr const char* kHfWeightsFile = "model.safetensors";
constexpr const char* kHfWeightsIndexFile = "model.safetensors.index.json";

// model.safetensors.index.json's weight_map (tensor name -> shard file name). Corruption naming
// `path` when the text is not such an index, or a shard name is not a plain file name of the
// folder (empty, ".", "..", or holding a '/').
Status ParseHfWeightsIndex(const std::string& text, const std::string& path,
                           std::map<std::string, std::string>* weight_map);

class HfWeights {
 public:
  HfWeights() = default;
  HfWeights(HfWeights&&) = default;
  HfWeights& operator=(HfWeights&&) = default;

  // Opens `dir`'s weights: model.safetensors when it exists (as transformers does), else the
  // index and its shards. InvalidArgument when the folder has neither (naming pytorch_model.bin
  // when that is what it has: keel reads safetensors only); Corruption naming the file when the
  // index is damaged, a shard lacks a tensor the index puts there, holds one it does not list, or
  // two shards hold the same name.
  static Status Open(Env* env, const std::string& dir, HfWeights* out);

  // The files read, as given to Open (dir/name).
  std::vector<std::string> files() const;
  // Every tensor's name, dtype and shape.
  struct Info {
    std::string dtype;
    std::vector<int64_t> shape;
    std::string file;
  };
  const std::map<std::string, Info>& tensors() const { return info_; }
  const Info* Find(const std::string& name) const;
  // The dtypes present ("BF16", "F32", ...).
  std::set<std::string> dtypes() const;

  // Tensor `name`, which must have exactly `shape` and dtype F32, F16 or BF16, as fp32 in `dst`
  // (numel(shape) floats). Corruption naming the file, the tensor and what was expected.
  Status ReadF32(const std::string& name, const std::vector<int64_t>& shape, float* dst) const;

 private:
  std::vector<MappedSafetensors> files_;
  std::map<std::string, Info> info_;
  std::map<std::string, size_t> file_of_;  // tensor -> index into files_
};

// The fp32 value of an IEEE half (exact) and of a bfloat16 (exact).
float HalfToFloat(uint16_t h);
float Bf16ToFloat(uint16_t b);

}  // namespace keel

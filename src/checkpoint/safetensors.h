// safetensors files (the Hugging Face format): an 8-byte little-endian header length, a JSON
// header {"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
// "__metadata__": {string: string}}, then the raw tensor bytes. One logical tensor per name.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/env.h"
#include "core/status.h"

namespace keel {

struct TensorView {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;  // host memory, fp32
};

// Writes atomically (temporary file, fsync, rename).
Status WriteSafetensors(Env* env, const std::string& path, const std::vector<TensorView>& tensors,
                        const std::map<std::string, std::string>& metadata);

struct LoadedTensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

// Reads every F32 tensor; errors name the file and what is wrong (truncated, bad header, dtype).
Status ReadSafetensors(Env* env, const std::string& path, std::map<std::string, LoadedTensor>* out,
                       std::map<std::string, std::string>* metadata);

}  // namespace keel

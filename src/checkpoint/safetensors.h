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

// Streams a safetensors image into `file` straight from the tensors' memory (no staging copy).
Status AppendSafetensors(WritableFile* file, const std::vector<TensorView>& tensors,
                         const std::map<std::string, std::string>& metadata);

// Writes atomically (temporary file, fsync, rename).
Status WriteSafetensors(Env* env, const std::string& path, const std::vector<TensorView>& tensors,
                        const std::map<std::string, std::string>& metadata);

struct LoadedTensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

// A tensor inside a safetensors image held in memory (e.g. mmap'd).
struct TensorRef {
  std::string dtype;  // "F32", "BF16", ...
  std::vector<int64_t> shape;
  const char* data = nullptr;
  uint64_t bytes = 0;
};
// Parses the header of an image and checks every tensor's offsets lie inside it and match its
// shape and dtype size. `path` names the file in errors.
Status ParseSafetensors(const char* data, size_t size, const std::string& path,
                        std::map<std::string, TensorRef>* out,
                        std::map<std::string, std::string>* metadata);

// Reads every F32 tensor; errors name the file and what is wrong (truncated, bad header, dtype).
Status ReadSafetensors(Env* env, const std::string& path, std::map<std::string, LoadedTensor>* out,
                       std::map<std::string, std::string>* metadata);

}  // namespace keel

// safetensors files (the Hugging Face format): an 8-byte little-endian header length, a JSON
// header {"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
// "__metadata__": {string: string}}, then the raw tensor bytes. One logical tensor per name.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
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
// The largest header keel parses: the safetensors library's own limit (100 MB), with it in the
// message; a real header is a few hundred KiB.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// Parses the header of an image and checks every tensor's offsets lie inside it and match its
// shape and dtype size, that no two tensors' bytes overlap and that no key is given twice (JSON
// would keep the last silently). `path` names the file in errors.
Status ParseSafetensors(const char* data, size_t size, const std::string& path,
                        std::map<std::string, TensorRef>* out,
                        std::map<std::string, std::string>* metadata);

// Reads every F32 tensor; errors name the file and what is wrong (truncated, bad header, dtype).
Status ReadSafetensors(Env* env, const std::string& path, std::map<std::string, LoadedTensor>* out,
                       std::map<std::string, std::string>* metadata);

// A safetensors file mapped read-only (Env::MapReadOnly) with its header parsed: tensors are read
// in place by name, without a copy of the file. Every error names the file.
class MappedSafetensors {
 public:
  MappedSafetensors() = default;
  MappedSafetensors(MappedSafetensors&&) = default;
  MappedSafetensors& operator=(MappedSafetensors&&) = default;

  // Maps `path` and checks its header (ParseSafetensors).
  static Status Open(Env* env, const std::string& path, MappedSafetensors* out);

  const std::string& path() const { return path_; }
  // Every tensor by name; the views point into the mapping and live as long as this object.
  const std::map<std::string, TensorRef>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The whole mapped file (to checksum it).
  std::string_view bytes() const;
  // nullptr when there is no tensor `name`.
  const TensorRef* Find(const std::string& name) const;

  // The data of tensor `name`, which must be F32 of exactly `shape`; Corruption naming the file,
  // the tensor, and what was expected and found otherwise (missing, other dtype or shape).
  Status GetF32(const std::string& name, const std::vector<int64_t>& shape,
                const float** data) const;
  // GetF32, copied to `dst` (host memory, numel(shape) floats).
  Status CopyF32(const std::string& name, const std::vector<int64_t>& shape, float* dst) const;
  // Corruption naming the first tensor whose name is not in `expected` (a file that holds more
  // than the model it is loaded into).
  Status CheckNoOtherTensors(const std::set<std::string>& expected) const;

 private:
  Status FindF32(const std::string& name, const std::vector<int64_t>& shape,
                 const TensorRef** out) const;

  std::string path_;
  std::unique_ptr<ReadOnlyRegion> region_;
  std::map<std::string, TensorRef> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace keel

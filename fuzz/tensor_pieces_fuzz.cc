// The tensors of a checkpoint saved at any (tensor, pipeline, data) layout: the piece files'
// names, their safetensors headers and each tensor's "keel.pieces" metadata
// (CheckpointTensors::Open), then every tensor read whole (ReadAllFull) and re-cut in two along
// its first dimension. Input: the files' names, one a line, then each file's bytes; the manifest
// is written to match them (sizes and checksums), so the mutations reach the pieces themselves.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/manifest.h"
#include "checkpoint/tensor_pieces.h"
#include "fuzz_input.h"
#include "mem_env.h"
#include "model/tensor_split.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr size_t kFiles = 4;
  const std::vector<std::string> parts = keel::fuzz::SplitInput(data, size, kFiles + 1);
  keel::fuzz::MemEnv env;
  keel::Manifest manifest;
  std::istringstream names(parts[0]);
  std::string name;
  for (size_t i = 1; i <= kFiles && std::getline(names, name); ++i) {
    // Names keel could have written: one path component of printable ASCII (the manifest's JSON
    // holds them as written).
    bool plain = !name.empty() && name != "." && name != ".." && name != keel::kManifestFile;
    for (const char c : name) plain = plain && c >= 0x20 && c < 0x7f && c != '/';
    if (!plain || manifest.Find(name) != nullptr) continue;
    env.Put("/ckpt/" + name, parts[i]);
    manifest.files.push_back({name, parts[i].size(), keel::Xxh3(parts[i].data(), parts[i].size())});
  }
  env.Put("/ckpt/manifest.json", manifest.ToJson());

  keel::CheckpointTensors ckpt;
  if (!keel::CheckpointTensors::Open(&env, "/ckpt", &ckpt).ok()) return 0;
  keel::FullTensors full;
  if (!keel::ReadAllFull(ckpt, &full).ok()) return 0;
  // The second half (along dim 0) read from the pieces is the same bits as cut from the whole.
  for (const auto* group : {&full.weights, &full.moments})
    for (const auto& [name, ref] : *group) {
      const std::vector<int64_t>& shape = ref.shape;
      if (shape.empty() || shape[0] <= 0 || shape[0] % 2 != 0) continue;
      const keel::TensorSplit halves{0, {shape[0]}};
      size_t n = 1;
      for (const int64_t d : keel::ShardShape(halves, shape, 2)) n *= static_cast<size_t>(d);
      std::vector<float> read(n), cut(n);
      if (!ckpt.Read(name, halves, 1, 2, 0, n, read.data()).ok()) __builtin_trap();
      keel::ExtractShard(reinterpret_cast<const float*>(ref.data), shape, halves, 1, 2, cut.data());
      if (n > 0 && std::memcmp(read.data(), cut.data(), n * sizeof(float)) != 0) __builtin_trap();
    }
  return 0;
}

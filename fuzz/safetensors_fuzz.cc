// safetensors files (a checkpoint's model and optimizer, Hugging Face exports): the header and
// every tensor's offsets, then reading every F32 tensor out of the image.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "checkpoint/safetensors.h"
#include "fuzz_input.h"
#include "mem_env.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  keel::fuzz::MemEnv env;
  env.Put("/ckpt/model.safetensors", std::string_view(reinterpret_cast<const char*>(data), size));
  std::map<std::string, keel::LoadedTensor> tensors;
  std::map<std::string, std::string> metadata;
  (void)keel::ReadSafetensors(&env, "/ckpt/model.safetensors", &tensors, &metadata);
  // What the parser accepts has no two tensors over the same bytes (issue 35).
  std::map<std::string, keel::TensorRef> refs;
  if (!keel::ParseSafetensors(reinterpret_cast<const char*>(data), size, "m", &refs, nullptr).ok())
    return 0;
  for (const auto& [a, ra] : refs)
    for (const auto& [b, rb] : refs)
      if (a < b && ra.bytes > 0 && rb.bytes > 0 && ra.data < rb.data + rb.bytes &&
          rb.data < ra.data + ra.bytes)
        __builtin_trap();
  return 0;
}

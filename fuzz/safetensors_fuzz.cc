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
  return 0;
}

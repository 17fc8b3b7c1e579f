// A checkpoint's manifest.json: parsed, then checked against a checkpoint directory (names, sizes
// and checksums of the files it lists), as every load and `keel ckpt verify` do.
#include <cstddef>
#include <cstdint>

#include "checkpoint/manifest.h"
#include "fuzz_input.h"
#include "mem_env.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = keel::fuzz::AsString(data, size);
  keel::Manifest m;
  (void)keel::Manifest::FromJson(text, "manifest.json", &m);
  keel::fuzz::MemEnv env;
  env.Put("/ckpt/manifest.json", text);
  env.Put("/ckpt/state.json", "{}\n");
  env.Put("/ckpt/config.toml", "");
  (void)keel::VerifyCheckpointDir(&env, "/ckpt", /*check_contents=*/true, &m);
  return 0;
}

// What `keel ckpt import --hf DIR` reads before it builds a model: config.json (ParseHfConfig, then
// the run config it becomes, validated), model.safetensors.index.json (ParseHfWeightsIndex) and
// the shards it names (HfWeights::Open, every tensor read through ReadF32's dtype conversion).
// The input is three files: config.json, the index, and one shard, which the index reaches as
// "model-00001-of-00001.safetensors". No model is allocated: a hostile config may describe any
// size.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "config/train_config.h"
#include "fuzz_input.h"
#include "hf/hf_config.h"
#include "hf/hf_import.h"
#include "hf/hf_weights.h"
#include "mem_env.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string> parts = keel::fuzz::SplitInput(data, size, 3);
  keel::fuzz::MemEnv env;
  env.Put("/hf/config.json", parts[0]);
  env.Put("/hf/model.safetensors.index.json", parts[1]);
  env.Put("/hf/model-00001-of-00001.safetensors", parts[2]);

  keel::HfModelConfig mc;
  if (keel::ParseHfConfig(parts[0], "/hf/config.json", {}, &mc).ok()) {
    keel::CheckpointTokenizer tok;
    tok.kind = "none";
    tok.vocab_size = mc.spec.vocab;
    tok.eod_id = 0;
    keel::TrainConfig cfg;
    std::vector<std::string> notes;
    (void)keel::TrainConfigForSpec(mc.spec, tok, &cfg, &notes);
  }
  std::map<std::string, std::string> weight_map;
  (void)keel::ParseHfWeightsIndex(parts[1], "/hf/model.safetensors.index.json", &weight_map);
  keel::HfWeights weights;
  if (keel::HfWeights::Open(&env, "/hf", &weights).ok()) {
    std::vector<float> buf;
    for (const auto& [name, info] : weights.tensors()) {
      int64_t n = 1;
      for (int64_t d : info.shape) n *= d;  // the file holds them: bounded by its size
      buf.resize(static_cast<size_t>(n));
      (void)weights.ReadF32(name, info.shape, buf.data());
    }
  }
  return 0;
}

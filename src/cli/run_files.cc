#include "cli/run_files.h"

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "data/prepare.h"

namespace keel::cli {

Status SaveRunFiles(Env* env, const std::string& dir, GptModel& model,
                    const std::string& config_text, const std::string& dataset_prefix,
                    const DatasetMeta& meta) {
  KEEL_RETURN_IF_ERROR(env->CreateDirs(dir));
  Backend* be = model.backend();
  std::vector<float> host(model.num_params());
  be->CopyToHost(host.data(), model.param_data(), host.size());
  std::vector<TensorView> views;
  for (const ParamInfo& p : model.params())
    views.push_back({p.name, p.shape, host.data() + p.offset});
  KEEL_RETURN_IF_ERROR(WriteSafetensors(env, JoinPath(dir, "model.safetensors"), views,
                                        {{"format", "keel"}, {"keel_version", KEEL_VERSION}}));
  const GptSpec& s = model.spec();
  nlohmann::ordered_json j;
  j["keel_version"] = KEEL_VERSION;
  j["model"] = {{"num_layers", s.num_layers},           {"hidden", s.hidden},
                {"ffn_hidden", s.ffn_hidden},           {"heads", s.heads},
                {"max_positions", s.max_positions},     {"vocab", s.vocab},
                {"padded_vocab", s.padded_vocab},       {"alibi", s.alibi},
                {"embed_layernorm", s.embed_layernorm}, {"layernorm_eps", s.layernorm_eps}};
  j["tokenizer"] = {
      {"kind", meta.tokenizer}, {"eod_id", meta.eod_id}, {"vocab_size", meta.vocab_size}};
  if (meta.tokenizer == "sentencepiece") {
    // Copy the tokenizer model so the run directory is self-contained.
    std::string src = meta.tokenizer_model;
    if (!src.empty() && src[0] != '/') {
      auto slash = dataset_prefix.rfind('/');
      src = JoinPath(slash == std::string::npos ? "." : dataset_prefix.substr(0, slash), src);
    }
    std::string bytes;
    KEEL_RETURN_IF_ERROR(env->ReadFileToString(src, &bytes));
    KEEL_RETURN_IF_ERROR(WriteFileAtomic(env, JoinPath(dir, "tokenizer.model"), bytes));
    j["tokenizer"]["model"] = "tokenizer.model";
  }
  KEEL_RETURN_IF_ERROR(WriteFileAtomic(env, JoinPath(dir, "run.json"), j.dump(2) + "\n"));
  return WriteFileAtomic(env, JoinPath(dir, "config.toml"), config_text);
}

Status LoadRunFiles(Env* env, const std::string& dir, Backend* backend, LoadedRun* run,
                    std::unique_ptr<GptModel>* model) {
  std::string text;
  const std::string run_json = JoinPath(dir, "run.json");
  if (!env->FileExists(run_json))
    return Status::NotFound(run_json +
                            " does not exist: pass the directory given to `keel train --save`");
  KEEL_RETURN_IF_ERROR(env->ReadFileToString(run_json, &text));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.contains("model") || !j.contains("tokenizer"))
    return Status::Corruption(run_json +
                              ": not a keel run description (missing 'model' or 'tokenizer')");
  try {
    const auto& m = j["model"];
    GptSpec& s = run->spec;
    s.num_layers = m.at("num_layers");
    s.hidden = m.at("hidden");
    s.ffn_hidden = m.at("ffn_hidden");
    s.heads = m.at("heads");
    s.max_positions = m.at("max_positions");
    s.vocab = m.at("vocab");
    s.padded_vocab = m.at("padded_vocab");
    s.alibi = m.at("alibi");
    s.embed_layernorm = m.at("embed_layernorm");
    s.layernorm_eps = m.at("layernorm_eps");
    DatasetMeta meta;
    meta.tokenizer = j["tokenizer"].at("kind");
    meta.eod_id = j["tokenizer"].at("eod_id");
    meta.vocab_size = j["tokenizer"].at("vocab_size");
    if (j["tokenizer"].contains("model")) meta.tokenizer_model = j["tokenizer"]["model"];
    KEEL_RETURN_IF_ERROR(LoadTokenizerForDataset(JoinPath(dir, "run"), meta, &run->tokenizer));
  } catch (const nlohmann::json::exception& e) {
    return Status::Corruption(run_json + ": " + e.what());
  }
  std::map<std::string, LoadedTensor> tensors;
  const std::string weights = JoinPath(dir, "model.safetensors");
  KEEL_RETURN_IF_ERROR(ReadSafetensors(env, weights, &tensors, nullptr));
  *model = std::make_unique<GptModel>(backend, run->spec);
  for (const ParamInfo& p : (*model)->params()) {
    auto it = tensors.find(p.name);
    if (it == tensors.end())
      return Status::Corruption(weights + ": tensor '" + p.name + "' is missing");
    if (it->second.shape != p.shape)
      return Status::Corruption(weights + ": tensor '" + p.name + "' has the wrong shape");
    backend->CopyToDevice((*model)->param_data() + p.offset, it->second.data.data(), p.numel);
    tensors.erase(it);
  }
  if (!tensors.empty())
    return Status::Corruption(weights + ": unexpected tensor '" + tensors.begin()->first + "'");
  return Status::OK();
}

}  // namespace keel::cli

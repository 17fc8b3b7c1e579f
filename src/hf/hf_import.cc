#include "hf/hf_import.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <new>

#include "backend/registry.h"
#include "checkpoint/manifest.h"
#include "checkpoint/resume.h"
#include "checkpoint/train_checkpoint.h"
#include "config/config.h"
#include "core/timestamp.h"
#include "hf/hf_export.h"
#include "hf/hf_weights.h"
#include "journal/events.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"

namespace keel {
namespace {

using json = nlohmann::json;

std::string StripTrailingSlashes(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

std::string ParentDir(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash ? slash : 1);
}

// The names an HF tensor may carry besides the table's: HF's save_pretrained prefixes GPT-2's and
// BLOOM's tensors with "transformer." (published files have no prefix).
std::vector<std::string> NameVariants(HfArch arch, const std::string& name) {
  if (arch == HfArch::kLlama) return {name};
  return {name, "transformer." + name};
}

// Tensors of a folder that are not weights: buffers older transformers saved (GPT-2's causal
// mask, Llama's RoPE frequencies). keel computes them itself.
bool IsBuffer(HfArch arch, const std::string& name) {
  auto ends = [&](const char* suffix) {
    const size_t n = std::strlen(suffix);
    return name.size() >= n && name.compare(name.size() - n, n, suffix) == 0;
  };
  if (arch == HfArch::kGpt2) return ends(".attn.bias") || ends(".attn.masked_bias");
  if (arch == HfArch::kLlama) return ends(".self_attn.rotary_emb.inv_freq");
  return false;
}

// Every keel model setting is one of the resume rules' shape keys; seq-length is the run's.
bool IsModelKey(const std::string& key) {
  return ResumeKindOfKey(key) == ConfigChange::Kind::kShape && key != "seq-length";
}

std::string Unquoted(const std::string& literal) {
  if (literal.size() >= 2 && literal.front() == '"' && literal.back() == '"')
    return literal.substr(1, literal.size() - 2);
  return literal;
}

}  // namespace

Status TrainConfigForSpec(const GptSpec& spec, const CheckpointTokenizer& tok, TrainConfig* out,
                          std::vector<std::string>* notes) {
  TrainConfig c;
  c.model = spec;  // the shape is the config's own; the run's sizes follow it
  c.seq_length = spec.max_positions;
  c.micro_batch_size = 1;
  c.tokenizer = tok.kind == "gpt2" ? TokenizerKind::kGpt2 : TokenizerKind::kSentencePiece;
  c.model.eod_id = tok.eod_id;
  Status st = Validate(&c, notes);
  if (!st.ok())
    return Status::InvalidArgument("the model is outside what keel trains: " + st.message());
  // The config must describe exactly this model (a rule of Validate's would show here).
  GptSpec back = c.model, want = spec;
  if (want.padded_vocab == 0) want.padded_vocab = back.padded_vocab;
  want.eod_id = back.eod_id;
  if (SpecToJson(back) != SpecToJson(want))
    return Status::Internal("the config of the imported model describes another model: " +
                            SpecToJson(back).dump() + " vs " + SpecToJson(want).dump());
  *out = c;
  return Status::OK();
}

std::string ModelToml(const TrainConfig& cfg) {
  std::string out;
  for (const auto& [key, literal] : ConfigValues(cfg))
    if (IsModelKey(key)) out += key + " = " + literal + "\n";
  return out;
}

std::string ModelFlags(const TrainConfig& cfg) {
  std::string out;
  const auto defaults = ConfigValues(TrainConfig{});
  const auto values = ConfigValues(cfg);
  for (size_t i = 0; i < values.size(); ++i) {
    const auto& [key, literal] = values[i];
    if (!IsModelKey(key)) continue;
    // The flags that differ from keel's defaults (model.toml spells out every setting).
    if (literal == "false" || (i < defaults.size() && literal == defaults[i].second)) continue;
    if (!out.empty()) out += ' ';
    out.append("--").append(key);
    if (literal != "true") out.append(" ").append(Unquoted(literal));
  }
  return out;
}

Status WriteImportedCheckpoint(Env* env, const std::string& out_dir, const TrainConfig& cfg,
                               GptModel* model, const CheckpointTokenizer& tok,
                               const json& provenance, const CheckpointStore::Logger& log,
                               uint64_t* bytes) {
  const std::string out = StripTrailingSlashes(out_dir);
  const std::string tmp = out + ".tmp";
  KEEL_RETURN_IF_ERROR(CheckNewOutputDir(env, out, "keel ckpt import"));
  AdamWConfig oc;
  oc.beta1 = cfg.adam_beta1;
  oc.beta2 = cfg.adam_beta2;
  oc.eps = cfg.adam_eps;
  oc.weight_decay = cfg.weight_decay;
  AdamW optimizer(model->backend(), model->num_params(), oc);  // zero moments: a fresh state
  TrainCheckpointSource src;
  src.config = &cfg;
  src.model = model;
  src.optimizer = &optimizer;
  src.next_global_batch = cfg.global_batch_size;
  src.next_lr = LrSchedule::FromConfig(cfg).LrAt(cfg.global_batch_size);
  RunInfo run;
  run.meta.tokenizer = tok.kind;
  run.meta.tokenizer_model = tok.model_path;
  run.meta.vocab_size = tok.vocab_size;
  run.meta.eod_id = tok.eod_id;
  ImportEvent event;
  event.at = UtcTimestamp();
  event.keel_version = KEEL_VERSION;
  KEEL_RETURN_IF_ERROR(event.ProvenanceFromJson(provenance, "the import's provenance"));
  CheckpointStaging staging;
  std::vector<CheckpointFile> files;
  KEEL_RETURN_IF_ERROR(
      BuildTrainCheckpoint(env, src, run, json::array({json(event.ToJson())}), &staging, &files));
  for (CheckpointFile& f : files) {
    if (f.name != "state.json") continue;
    nlohmann::ordered_json state = nlohmann::ordered_json::parse(f.bytes);
    state[kImportStateKey] = provenance;
    f.bytes = state.dump(2) + "\n";
  }
  const std::string toml = "# the imported model's settings: keel train --config " +
                           JoinPath(out, kImportModelToml) + " --load " + out +
                           " --save RUN ...\n" + ModelToml(cfg);
  Status st = env->CreateDirs(tmp);
  auto write_all = [&]() -> Status {
    CheckpointStore store(env, tmp, log);
    SaveStats stats;
    KEEL_RETURN_IF_ERROR(store.Save(0, files, &stats));
    *bytes = stats.bytes;
    KEEL_RETURN_IF_ERROR(WriteFileAtomic(env, JoinPath(tmp, kImportModelToml), toml));
    KEEL_RETURN_IF_ERROR(env->SyncDir(tmp));
    return env->RenameFile(tmp, out);  // fails (ENOTEMPTY) if OUT was filled meanwhile
  };
  if (st.ok()) st = write_all();
  if (!st.ok()) {
    env->RemoveDirRecursive(tmp);  // best effort; OUT itself was never touched
    return st;
  }
  return env->SyncDir(ParentDir(out));
}

namespace {
Status ImportSteps(Env* env, const std::string& hf_dir, const std::string& out_dir,
                   const HfImportOptions& options, const CheckpointStore::Logger& log,
                   HfImportReport* report);
}  // namespace

Status ImportHf(Env* env, const std::string& hf_dir, const std::string& out_dir,
                const HfImportOptions& options, const CheckpointStore::Logger& log,
                HfImportReport* report) {
  try {
    return ImportSteps(env, hf_dir, out_dir, options, log, report);
  } catch (const std::bad_alloc&) {
    return Status::OutOfMemory(fmt::format(
        "out of memory while importing {}: the model is built in memory with its optimizer "
        "state (about 16 bytes per parameter), as training needs; import on a machine with more "
        "memory",
        hf_dir));
  }
}

namespace {

Status ImportSteps(Env* env, const std::string& hf_dir, const std::string& out_dir,
                   const HfImportOptions& options, const CheckpointStore::Logger& log,
                   HfImportReport* report) {
  *report = HfImportReport();
  const std::string dir = StripTrailingSlashes(hf_dir);
  const std::string out = StripTrailingSlashes(out_dir);
  report->hf_dir = dir;
  report->out_dir = out;
  report->checkpoint_dir = JoinPath(out, CheckpointDirName(0));
  KEEL_RETURN_IF_ERROR(CheckNewOutputDir(env, out, "keel ckpt import"));
  if (!env->IsDirectory(dir))
    return Status::InvalidArgument(dir + " is not a directory (a Hugging Face model folder)");
  const std::string config_path = JoinPath(dir, "config.json");
  if (!env->FileExists(config_path))
    return Status::InvalidArgument(dir +
                                   " has no config.json: it is not a Hugging Face model "
                                   "folder");
  std::string text;
  KEEL_RETURN_IF_ERROR(env->ReadFileToString(config_path, &text, kMaxHfJsonBytes));
  HfModelConfig mc;
  KEEL_RETURN_IF_ERROR(ParseHfConfig(text, config_path, options.config, &mc));
  report->arch = mc.arch;
  report->notes = mc.notes;
  HfWeights weights;
  KEEL_RETURN_IF_ERROR(HfWeights::Open(env, dir, &weights));
  report->weight_files = weights.files();
  // A layer has several tensors: a config claiming more layers than the files hold tensors is
  // refused before any table of that size is built.
  if (static_cast<size_t>(mc.spec.num_layers) > weights.tensors().size())
    return Status::Corruption(
        fmt::format("{} describes {} layers, but the weights hold {} tensors in all", config_path,
                    mc.spec.num_layers, weights.tensors().size()));

  std::string tok_note;
  KEEL_RETURN_IF_ERROR(RecognizeHfTokenizer(
      env, dir, mc.spec.vocab, mc.eos_token_id,
      options.gpt2_assets_dir.empty() ? DefaultGpt2AssetsDir() : options.gpt2_assets_dir,
      &report->tokenizer, &tok_note));
  report->tokenizer_note = tok_note;
  TrainConfig cfg;
  std::vector<std::string> defaults;  // of the config's other settings: not the user's concern
  KEEL_RETURN_IF_ERROR(TrainConfigForSpec(mc.spec, report->tokenizer, &cfg, &defaults));
  const GptSpec spec = cfg.model;
  report->vocab = spec.vocab;
  report->padded_vocab = spec.padded_vocab;
  report->model_flags = ModelFlags(cfg);

  // Which file name each table entry has (published files and save_pretrained's differ in prefix).
  const std::vector<HfTensorMapping> table = HfTensorMappings(mc.arch, spec);
  std::map<std::string, std::string> actual;  // table name -> name in the files
  std::set<std::string> used;
  for (const HfTensorMapping& m : table) {
    for (const std::string& v : NameVariants(mc.arch, m.hf_name)) {
      if (weights.Find(v) == nullptr) continue;
      if (actual.count(m.hf_name))
        return Status::Corruption(
            fmt::format("the weights hold both '{}' and '{}'", actual[m.hf_name], v));
      actual[m.hf_name] = v;
      used.insert(v);
    }
    if (!actual.count(m.hf_name)) {
      std::vector<int64_t> shape = m.hf_shape;
      return Status::Corruption(fmt::format(
          "{}: the weights have no tensor '{}' [{}], which a {} model of this config.json has", dir,
          m.hf_name, fmt::join(shape, ", "), HfArchTitle(mc.arch)));
    }
    // Shapes and dtypes before anything is allocated: the model is then no larger than the files.
    const HfWeights::Info& info = *weights.Find(actual[m.hf_name]);
    if (info.shape != m.hf_shape)
      return Status::Corruption(
          fmt::format("{}: tensor '{}' has shape [{}], expected [{}]", info.file, actual[m.hf_name],
                      fmt::join(info.shape, ", "), fmt::join(m.hf_shape, ", ")));
    if (info.dtype != "F32" && info.dtype != "F16" && info.dtype != "BF16")
      return Status::InvalidArgument(fmt::format(
          "{}: tensor '{}' is {}; keel imports F32, F16 and BF16 weights (each exactly as fp32)",
          info.file, actual[m.hf_name], info.dtype));
  }
  // What else the files hold: buffers keel computes itself, a tied head's copy, or a refusal.
  std::string tied_head;
  size_t buffers = 0;
  for (const auto& [name, info] : weights.tensors()) {
    if (used.count(name)) continue;
    if (IsBuffer(mc.arch, name)) {
      ++buffers;
    } else if (!spec.untie_embeddings &&
               (name == "lm_head.weight" || name == "transformer.lm_head.weight")) {
      tied_head = name;
    } else {
      return Status::Corruption(fmt::format(
          "{} holds tensor '{}' ({} [{}]), which keel's {} model of this config.json has no "
          "place for",
          info.file, name, info.dtype, fmt::join(info.shape, ", "), HfArchTitle(mc.arch)));
    }
  }
  if (buffers > 0)
    report->notes.push_back(fmt::format(
        "{} buffer tensors left out ({}): they are not weights, keel computes them", buffers,
        mc.arch == HfArch::kGpt2 ? "attn.bias / attn.masked_bias, the causal mask"
                                 : "rotary_emb.inv_freq, RoPE's frequencies"));

  // The weights, tensor by tensor into the model: every HF tensor back through its layout change.
  std::unique_ptr<Backend> backend;
  KEEL_RETURN_IF_ERROR(MakeBackend(kHostBackend, 1, &backend));
  GptModel model(backend.get(), spec);
  std::map<std::string, std::vector<const HfTensorMapping*>> by_keel;
  for (const HfTensorMapping& m : table) by_keel[m.keel_name].push_back(&m);
  std::vector<float> keel_t, hf_t;
  for (const ParamInfo& p : model.params()) {
    auto it = by_keel.find(p.name);
    if (it == by_keel.end())
      return Status::Internal("no Hugging Face tensor maps to keel's " + p.name);
    keel_t.assign(p.numel, 0.0f);  // the vocabulary's padding rows stay zero
    for (const HfTensorMapping* m : it->second) {
      hf_t.resize(static_cast<size_t>(NumElements(m->hf_shape)));
      KEEL_RETURN_IF_ERROR(weights.ReadF32(actual[m->hf_name], m->hf_shape, hf_t.data()));
      report->dtypes.insert(weights.Find(actual[m->hf_name])->dtype);
      size_t bad = 0;
      for (float v : hf_t) bad += !std::isfinite(v);
      if (bad > 0)
        return Status::Corruption(fmt::format(
            "{}: tensor '{}' holds {} NaN or Inf values; keel never trains on non-finite weights",
            weights.Find(actual[m->hf_name])->file, actual[m->hf_name], bad));
      HfToKeel(*m, hf_t.data(), keel_t.data());
      ++report->num_tensors;
    }
    backend->CopyToDevice(model.mutable_param_data() + p.offset, keel_t.data(), p.numel);
  }
  // A tied head saved anyway must be the embedding, or the folder means another model.
  if (!tied_head.empty()) {
    const std::vector<int64_t> shape = {spec.vocab, spec.hidden};
    hf_t.resize(static_cast<size_t>(NumElements(shape)));
    keel_t.resize(hf_t.size());
    KEEL_RETURN_IF_ERROR(weights.ReadF32(tied_head, shape, hf_t.data()));
    KEEL_RETURN_IF_ERROR(weights.ReadF32(actual[table.front().hf_name], shape, keel_t.data()));
    if (std::memcmp(hf_t.data(), keel_t.data(), hf_t.size() * sizeof(float)) != 0)
      return Status::InvalidArgument(fmt::format(
          "{}: tie_word_embeddings is true but {} differs from the word embedding {}: the output "
          "layer is tied in the config and not in the weights; fix config.json",
          config_path, tied_head, actual[table.front().hf_name]));
    report->notes.push_back(tied_head +
                            " left out: it equals the word embedding, to which the output layer "
                            "is tied (tie_word_embeddings)");
  }
  if (report->padded_vocab != report->vocab)
    report->notes.push_back(fmt::format(
        "vocabulary {} padded to {} with zero rows (--make-vocab-size-divisible-by {}); the "
        "padding's logits are masked, so they change nothing",
        report->vocab, report->padded_vocab, cfg.make_vocab_size_divisible_by));
  ImportEvent origin;
  origin.from = dir;
  origin.model_type = HfModelType(mc.arch);
  origin.files = report->weight_files;
  origin.dtypes = std::vector<std::string>(report->dtypes.begin(), report->dtypes.end());
  const json provenance = origin.ProvenanceToJson();
  return WriteImportedCheckpoint(env, out, cfg, &model, report->tokenizer, provenance, log,
                                 &report->bytes);
}

}  // namespace

}  // namespace keel

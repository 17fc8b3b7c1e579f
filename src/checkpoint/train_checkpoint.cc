#include "checkpoint/train_checkpoint.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "checkpoint/manifest.h"
#include "core/json_number.h"
#include "core/timestamp.h"
#include "data/prepare.h"
#include "optim/lr_schedule.h"

namespace keel {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

const char* StyleName(LrDecayStyle s) {
  switch (s) {
    case LrDecayStyle::kConstant:
      return "constant";
    case LrDecayStyle::kLinear:
      return "linear";
    case LrDecayStyle::kCosine:
      return "cosine";
  }
  return "?";
}

std::string SiblingPath(const std::string& prefix, const std::string& file) {
  if (file.empty() || file[0] == '/') return file;
  const auto slash = prefix.rfind('/');
  return JoinPath(slash == std::string::npos ? "." : prefix.substr(0, slash), file);
}

}  // namespace

json SpecToJson(const GptSpec& s) {
  return json{{"num_layers", s.num_layers},
              {"hidden", s.hidden},
              {"ffn_hidden", s.ffn_hidden},
              {"heads", s.heads},
              {"max_positions", s.max_positions},
              {"vocab", s.vocab},
              {"padded_vocab", s.padded_vocab},
              {"alibi", s.alibi},
              {"embed_layernorm", s.embed_layernorm},
              {"layernorm_eps", s.layernorm_eps},
              {"qk_layernorm", s.qk_layernorm},
              {"z_loss", s.z_loss},
              {"reset_position_ids", s.reset_position_ids},
              {"reset_attention_mask", s.reset_attention_mask},
              {"eod_id", s.eod_id}};
}

Status SpecFromJson(const json& m, const std::string& where, GptSpec* out) {
  try {
    GptSpec s;
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
    s.qk_layernorm = m.value("qk_layernorm", false);  // absent in checkpoints before the option
    s.z_loss = m.value("z_loss", 0.0f);
    s.reset_position_ids = m.value("reset_position_ids", false);
    s.reset_attention_mask = m.value("reset_attention_mask", false);
    s.eod_id = m.value("eod_id", int32_t{-1});
    *out = s;
  } catch (const json::exception& e) {
    return Status::Corruption(where + ": malformed model description: " + e.what());
  }
  return Status::OK();
}

Status BuildTrainCheckpoint(Env* env, const TrainCheckpointSource& src, const RunInfo& run,
                            const json& history, std::vector<float>* staging,
                            std::vector<CheckpointFile>* out, const json& guard_state) {
  out->clear();
  GptModel& model = *src.model;
  AdamW& opt = *src.optimizer;
  const TrainConfig& cfg = *src.config;
  const TrainState& ts = src.state;
  const TrainCounters& c = ts.counters;
  const size_t n = model.num_params();
  Backend* be = model.backend();
  // Host memory (the CPU backend) is written straight from the model and optimizer: the save runs
  // between iterations, so nothing changes it meanwhile. Device memory is staged on the host.
  const float* host_p = be->HostReadable(model.param_data());
  const float* host_m = be->HostReadable(opt.exp_avg());
  const float* host_v = be->HostReadable(opt.exp_avg_sq());
  if (host_p == nullptr || host_m == nullptr || host_v == nullptr) {
    staging->resize(3 * n);
    float* p = staging->data();
    be->CopyToHost(p, model.param_data(), n);
    be->CopyToHost(p + n, opt.exp_avg(), n);
    be->CopyToHost(p + 2 * n, opt.exp_avg_sq(), n);
    host_p = p, host_m = p + n, host_v = p + 2 * n;
  }

  const std::map<std::string, std::string> st_meta = {{"format", "pt"},
                                                      {"writer", "keel " KEEL_VERSION}};
  CheckpointFile weights{"model.safetensors", "", true, {}, st_meta};
  CheckpointFile moments{"optimizer.safetensors", "", true, {}, st_meta};
  for (const ParamInfo& p : model.params()) {
    weights.tensors.push_back({p.name, p.shape, host_p + p.offset});
    moments.tensors.push_back({"exp_avg." + p.name, p.shape, host_m + p.offset});
  }
  for (const ParamInfo& p : model.params())
    moments.tensors.push_back({"exp_avg_sq." + p.name, p.shape, host_v + p.offset});

  const LrSchedule sched = LrSchedule::FromConfig(cfg);
  const LogIntervalState& iv = ts.interval;
  ojson s;
  s["format"] = "keel-train-state";
  s["format_version"] = 1;
  s["keel_version"] = KEEL_VERSION;
  s["saved_at"] = UtcTimestamp();
  s["iteration"] = c.iteration;
  s["counters"] = {{"iteration", c.iteration},
                   {"consumed_samples", c.consumed_samples},
                   {"consumed_tokens", c.consumed_tokens},
                   {"skipped_iterations", c.skipped_iterations},
                   {"nan_iterations", c.nan_iterations},
                   {"data_skipped_iterations", c.data_skipped_iterations}};
  s["optimizer"] = {{"type", "adamw"},
                    {"step", ts.optimizer_step},
                    {"beta1", opt.config().beta1},
                    {"beta2", opt.config().beta2},
                    {"eps", opt.config().eps},
                    {"weight_decay", opt.config().weight_decay},
                    {"clip_grad", cfg.clip_grad}};
  s["scheduler"] = {{"decay_style", StyleName(cfg.lr_decay_style)},
                    {"max_lr", cfg.lr},
                    {"min_lr", cfg.min_lr},
                    {"warmup_samples", sched.warmup_samples()},
                    {"decay_samples", sched.decay_samples()},
                    {"lr_scale", ts.lr_scale},
                    {"consumed_samples", c.consumed_samples},
                    {"next_lr", src.next_lr}};
  s["batch"] = {{"global_batch_size", cfg.global_batch_size},
                {"micro_batch_size", cfg.micro_batch_size},
                {"rampup_batch_size", cfg.rampup_batch_size},
                {"next_global_batch", src.next_global_batch}};
  s["rng"] = {{"generator", "philox4x32-10"},
              {"seed", cfg.seed},
              {"streams",
               "counter-based: keyed by (seed, purpose, stream); positions derive from the "
               "counters above, so no generator state is stored"}};
  s["data"] = {{"path", run.data_path},
               {"split", cfg.split},
               {"seed", cfg.seed},
               {"seq_length", cfg.seq_length},
               {"cursor_samples", c.consumed_samples},
               {"datasets", run.datasets},
               {"order",
                "Feistel permutation per (seed, split, epoch) of each dataset; a mixture "
                "interleaves them by error diffusion over the weights"},
               {"order_salt", ts.data_salt},
               {"skipped_iteration_ranges", json::array()}};
  for (const IterationRange& r : ts.skip_ranges)
    s["data"]["skipped_iteration_ranges"].push_back({r.first, r.last});
  s["metrics"] = {{"interval",
                   {{"loss_sum", JsonNumber(iv.loss_sum)},
                    {"ms", JsonNumber(iv.ms)},
                    {"flops", JsonNumber(iv.flops)},
                    {"iters", iv.iters},
                    {"ok", iv.ok},
                    {"skipped", iv.skipped},
                    {"nan", iv.nan},
                    {"samples", iv.samples},
                    {"dataset_loss_sum", ojson::array()},
                    {"dataset_sequences", iv.dataset_sequences}}}};
  for (double v : iv.dataset_loss_sum)
    s["metrics"]["interval"]["dataset_loss_sum"].push_back(ojson(JsonNumber(v)));
  s["guard"] = guard_state;
  s["model"] = SpecToJson(model.spec());
  s["tokenizer"] = {{"kind", run.meta.tokenizer},
                    {"eod_id", run.meta.eod_id},
                    {"vocab_size", run.meta.vocab_size}};
  s["config_hash"] = HexDigest(ConfigHash(cfg));
  s["history"] = history;

  std::vector<CheckpointFile> files;
  files.push_back(std::move(weights));
  files.push_back(std::move(moments));
  if (run.meta.tokenizer == "sentencepiece") {
    CheckpointFile tok;
    tok.name = "tokenizer.model";
    KEEL_RETURN_IF_ERROR(
        env->ReadFileToString(SiblingPath(run.data_path, run.meta.tokenizer_model), &tok.bytes));
    s["tokenizer"]["model"] = "tokenizer.model";
    files.push_back(std::move(tok));
  }
  files.push_back({"state.json", s.dump(2) + "\n", false, {}, {}});
  files.push_back(
      {"config.toml",
       "# resolved config of the run (load it with keel train --config)\n" + FormatConfig(cfg),
       false,
       {},
       {}});
  *out = std::move(files);
  return Status::OK();
}

Status ReadSavedTrainState(Env* env, const std::string& dir, SavedTrainState* out) {
  const std::string sp = JoinPath(dir, "state.json");
  std::string text;
  KEEL_RETURN_IF_ERROR(env->ReadFileToString(sp, &text));
  json s = json::parse(text, nullptr, false);
  if (s.is_discarded() || !s.is_object() || s.value("format", "") != "keel-train-state")
    return Status::Corruption(sp + " is not a keel training state");
  if (s.value("format_version", 0) != 1)
    return Status::Corruption(sp + ": format_version " + s.value("format_version", json()).dump() +
                              " is not supported by keel " KEEL_VERSION);
  SavedTrainState r;
  r.dir = dir;
  try {
    TrainState& t = r.train;
    const json& c = s.at("counters");
    t.counters.iteration = c.at("iteration");
    t.counters.consumed_samples = c.at("consumed_samples");
    t.counters.consumed_tokens = c.at("consumed_tokens");
    t.counters.skipped_iterations = c.at("skipped_iterations");
    t.counters.nan_iterations = c.at("nan_iterations");
    t.counters.data_skipped_iterations = c.value("data_skipped_iterations", int64_t{0});
    const json& d = s.at("data");
    t.data_salt = d.value("order_salt", uint64_t{0});
    for (const json& p : d.value("skipped_iteration_ranges", json::array()))
      t.skip_ranges.push_back({p.at(0).get<int64_t>(), p.at(1).get<int64_t>()});
    r.guard = s.value("guard", json());
    t.optimizer_step = s.at("optimizer").at("step");
    t.lr_scale = s.at("scheduler").at("lr_scale");
    r.history = s.value("history", json::array());
    const json& iv = s.at("metrics").at("interval");
    LogIntervalState& l = t.interval;
    l.loss_sum = NumberFromJson(iv.at("loss_sum"));
    l.ms = NumberFromJson(iv.at("ms"));
    l.flops = NumberFromJson(iv.at("flops"));
    l.iters = iv.at("iters");
    l.ok = iv.at("ok");
    l.skipped = iv.at("skipped");
    l.nan = iv.value("nan", int64_t{0});  // absent before keel counted NaNs apart from skips
    l.samples = iv.at("samples");
    for (const json& v : iv.value("dataset_loss_sum", json::array()))
      l.dataset_loss_sum.push_back(NumberFromJson(v));
    l.dataset_sequences = iv.value("dataset_sequences", std::vector<int64_t>{});
    if (l.dataset_loss_sum.size() != l.dataset_sequences.size())
      return Status::Corruption(sp +
                                ": metrics.interval: per-dataset sums and counts differ in length");
  } catch (const json::exception& e) {
    return Status::Corruption(sp + ": " + e.what());
  }
  KEEL_RETURN_IF_ERROR(SpecFromJson(s.value("model", json()), sp, &r.spec));
  const std::string cp = JoinPath(dir, "config.toml");
  KEEL_RETURN_IF_ERROR(env->ReadFileToString(cp, &r.config_text));
  KEEL_RETURN_IF_ERROR(ApplyToml(r.config_text, cp, &r.config));
  r.config.vocab_size = r.spec.vocab;
  r.config.padded_vocab_size = r.spec.padded_vocab;
  r.state = std::move(s);
  *out = std::move(r);
  return Status::OK();
}

Status ReadVerifiedCheckpoint(Env* env, const std::string& dir, SavedTrainState* out) {
  KEEL_RETURN_IF_ERROR(VerifyCheckpointDir(env, dir, /*check_contents=*/true, nullptr));
  return ReadSavedTrainState(env, dir, out);
}

namespace {

// Copies every parameter's tensor, named `prefix + name` for each (prefix, destination) pair, from
// the safetensors file `path` into backend memory; each must be F32 of its parameter's shape, and
// the file may hold nothing else.
Status LoadParams(Env* env, const std::string& path, const std::vector<ParamInfo>& params,
                  const std::vector<std::pair<std::string, float*>>& prefixed, Backend* be) {
  MappedSafetensors file;
  KEEL_RETURN_IF_ERROR(MappedSafetensors::Open(env, path, &file));
  std::set<std::string> expected;
  std::vector<float> tmp;
  for (const auto& [prefix, dst] : prefixed) {
    for (const ParamInfo& p : params) {
      tmp.resize(p.numel);
      KEEL_RETURN_IF_ERROR(file.CopyF32(prefix + p.name, p.shape, tmp.data()));
      be->CopyToDevice(dst + p.offset, tmp.data(), p.numel);
      expected.insert(prefix + p.name);
    }
  }
  return file.CheckNoOtherTensors(expected);
}

}  // namespace

Status NonFiniteWeightsError(const std::string& dir, const NonFiniteParams& nf,
                             const std::string& refused, const std::string& instead) {
  const size_t slash = dir.find_last_of('/');
  const std::string run = slash == std::string::npos ? "." : dir.substr(0, slash);
  std::string command = instead;
  if (const size_t at = command.find("RUN/"); at != std::string::npos) command.replace(at, 3, run);
  return Status::Corruption(fmt::format(
      "refusing to {} {}: its weights hold {} NaN or Inf values ({} in {}, the first tensor "
      "holding one), so it was saved after its run diverged. Use an older checkpoint: `keel ckpt "
      "list {}` lists them; then {}",
      refused, dir, nf.count, nf.in_first_tensor, nf.first_tensor, run, command));
}

Status LoadCheckpointTensors(Env* env, const SavedTrainState& saved, GptModel* model,
                             AdamW* optimizer) {
  if (SpecToJson(saved.spec) != SpecToJson(model->spec()))
    return Status::InvalidArgument(
        fmt::format("{}: the checkpoint's model ({}) differs from this run's ({})", saved.dir,
                    SpecToJson(saved.spec).dump(), SpecToJson(model->spec()).dump()));
  Backend* be = model->backend();
  KEEL_RETURN_IF_ERROR(LoadParams(env, JoinPath(saved.dir, "model.safetensors"), model->params(),
                                  {{"", model->param_data()}}, be));
  if (const NonFiniteParams nf = FindNonFiniteParams(*model); nf.count > 0)
    return NonFiniteWeightsError(saved.dir, nf, "continue training from",
                                 "`keel train ... --load RUN/iter_N` continues from one");
  return LoadParams(env, JoinPath(saved.dir, "optimizer.safetensors"), model->params(),
                    {{"exp_avg.", optimizer->exp_avg()}, {"exp_avg_sq.", optimizer->exp_avg_sq()}},
                    be);
}

Status LoadModelFromCheckpoint(Env* env, const std::string& path, Backend* backend,
                               const CheckpointStore::Logger& log, LoadedModel* out) {
  std::string dir;
  KEEL_RETURN_IF_ERROR(ResolveCheckpointDir(env, path, log, NamedCheckpoint::kVerify, &dir));
  out->checkpoint_dir = dir;
  KEEL_RETURN_IF_ERROR(ReadSavedTrainState(env, dir, &out->saved));
  out->model = std::make_unique<GptModel>(backend, out->saved.spec);
  KEEL_RETURN_IF_ERROR(LoadParams(env, JoinPath(dir, "model.safetensors"), out->model->params(),
                                  {{"", out->model->param_data()}}, backend));
  if (const NonFiniteParams nf = FindNonFiniteParams(*out->model); nf.count > 0)
    return NonFiniteWeightsError(dir, nf, "load",
                                 "`keel sample --load RUN/iter_N` samples from one");
  const json& t = out->saved.state.at("tokenizer");
  DatasetMeta meta;
  meta.tokenizer = t.value("kind", "");
  meta.eod_id = t.value("eod_id", -1);
  meta.vocab_size = t.value("vocab_size", 0);
  meta.tokenizer_model = t.value("model", "");
  return LoadTokenizerForDataset(JoinPath(dir, "state"), meta, &out->tokenizer);
}

}  // namespace keel

#include "checkpoint/train_checkpoint.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <set>

#include "checkpoint/manifest.h"
#include "checkpoint/optimizer_shards.h"
#include "checkpoint/tensor_pieces.h"
#include "core/json_number.h"
#include "core/json_reader.h"
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
  return ShapeToJson(s);
}

Status SpecFromJson(const json& m, const std::string& where, GptSpec* out) {
  const json doc = {{"model", m}};  // so that paths read "model.hidden"
  JsonReader r(where, doc, kDamagedCheckpointFix);
  GptSpec s;
  ShapeFromJson(r.root()["model"], &s);
  KEEL_RETURN_IF_ERROR(r.status());
  // A model keel cannot build (edited by hand): the limits a config is held to.
  if (Status st = CheckShape(s, ShapeCheck::kResolved); !st.ok())
    return Status::Corruption(where + ": key 'model' describes no model keel can build: " +
                              st.message() + " (" + m.dump() + "); " + kDamagedCheckpointFix);
  *out = s;
  return Status::OK();
}

Status BuildTrainCheckpoint(Env* env, const TrainCheckpointSource& src, const RunInfo& run,
                            const json& history, CheckpointStaging* staging,
                            std::vector<CheckpointFile>* out, const json& guard_state) {
  out->clear();
  GptModel& model = *src.model;
  AdamW& opt = *src.optimizer;
  const TrainConfig& cfg = *src.config;
  const TrainState& ts = src.state;
  const TrainCounters& c = ts.counters;
  const size_t n = model.num_params();
  Backend* be = model.backend();
  // Each rank writes its shard of the moments (optimizer_shards.h); rank 0 writes the rest.
  const ShardRange shard = ShardOf(n, src.rank, src.world);
  const ShardRange& held = opt.shard();
  KEEL_CHECK(shard.begin >= held.begin && shard.end <= held.end,
             "a rank saves moments its optimizer does not hold");
  const size_t skip = shard.begin - held.begin;  // into the optimizer's buffers
  // The save runs between iterations, so nothing changes the weights and moments meanwhile: the
  // CPU backend's views are its memory itself; a device backend's are host copies.
  be->Synchronize();
  if (staging->copy) {
    // The snapshot of an asynchronous save: the loop changes the live memory after it returns.
    staging->deferred.clear();
    auto snapshot = [be, staging](const float* src, size_t count, std::vector<float>* buf) {
      buf->resize(count);
      const HostView live = be->ViewOnHost(src, count);
      if (staging->defer && live.zero_copy()) {
        staging->deferred.push_back({live.data(), buf->data(), count});
      } else {
        be->CopyToHost(buf->data(), src, count);
      }
      return HostView::ZeroCopy(buf->data(), count);
    };
    staging->params = snapshot(model.param_data(), n, &staging->params_copy);
    staging->exp_avg = snapshot(opt.exp_avg(), held.size(), &staging->exp_avg_copy);
    staging->exp_avg_sq = snapshot(opt.exp_avg_sq(), held.size(), &staging->exp_avg_sq_copy);
  } else {
    staging->params = be->ViewOnHost(model.param_data(), n);
    staging->exp_avg = be->ViewOnHost(opt.exp_avg(), held.size());
    staging->exp_avg_sq = be->ViewOnHost(opt.exp_avg_sq(), held.size());
  }
  const float* host_p = staging->params.data();
  const float* host_m = staging->exp_avg.data();
  const float* host_v = staging->exp_avg_sq.data();

  const std::map<std::string, std::string> st_meta = {{"format", "pt"},
                                                      {"writer", "keel " KEEL_VERSION}};
  CheckpointFile weights{"model.safetensors", "", true, {}, st_meta};
  std::map<std::string, std::string> moment_meta = st_meta;
  if (src.world > 1) {
    moment_meta["shard"] = fmt::format("elements [{}, {}) of the flat parameter buffer of {}",
                                       shard.begin, shard.end, n);
    moment_meta["rank"] = fmt::format("{} of {}", src.rank, src.world);
  }
  CheckpointFile moments{OptimizerFileName(src.rank, src.world), "", true, {}, moment_meta};
  std::vector<CheckpointFile> tensor_files;
  if (src.tensor > 1 || src.pipeline > 1) {
    // Tensor and pipeline parallel: each rank's slices of its stage and its moment shard as
    // pieces (tensor_pieces.h); the data rank 0 of each (tensor, pipeline) position writes the
    // weights, tensor rank 0 the replicated tensors, the first stage the tied embedding.
    PieceCoords pc;
    pc.tp = src.tensor_rank, pc.tensor = src.tensor, pc.dp = src.rank, pc.data = src.world;
    pc.pp = src.pipeline_rank, pc.pipeline = src.pipeline;
    std::vector<LocalTensor> locals;
    for (const ParamInfo& p : model.params()) {
      LocalTensor t;
      t.name = p.name;
      t.full_shape = p.full_shape;
      t.split = p.split;
      t.tensor_rank = src.tensor_rank;
      t.tensor_size = src.tensor;
      t.weights = const_cast<float*>(host_p + p.offset);  // only read
      t.owner = !p.tied_copy;
      const size_t lo = std::max(p.offset, shard.begin);
      const size_t hi = std::min(p.offset + p.numel, shard.end);
      if (lo < hi) {
        t.moment_begin = lo - p.offset;
        t.moment_end = hi - p.offset;
        t.exp_avg = const_cast<float*>(host_m + (lo - held.begin));
        t.exp_avg_sq = const_cast<float*>(host_v + (lo - held.begin));
      }
      locals.push_back(std::move(t));
    }
    KEEL_RETURN_IF_ERROR(BuildPieceFiles(pc, locals, /*with_moments=*/true, &tensor_files));
    if (src.rank != 0 || src.tensor_rank != 0 || src.pipeline_rank != 0) {
      *out = std::move(tensor_files);
      return Status::OK();
    }
  } else {
    for (const ParamInfo& p : model.params())
      weights.tensors.push_back({p.name, p.shape, host_p + p.offset});
    AppendMomentPieces(model.params(), "exp_avg.", shard, host_m + skip, &moments.tensors);
    AppendMomentPieces(model.params(), "exp_avg_sq.", shard, host_v + skip, &moments.tensors);
    if (src.rank != 0) {
      out->push_back(std::move(moments));
      return Status::OK();
    }
    tensor_files.push_back(std::move(weights));
    tensor_files.push_back(std::move(moments));
  }

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
  std::vector<std::string> moment_files;
  for (int pp = 0; pp < src.pipeline; ++pp)
    for (int tp = 0; tp < src.tensor; ++tp)
      for (int r = 0; r < src.world; ++r)
        moment_files.push_back(
            src.tensor > 1 || src.pipeline > 1
                ? MomentsFileName(PieceCoords{tp, src.tensor, pp, src.pipeline, r, src.world})
                : OptimizerFileName(r, src.world));
  s["optimizer"] = {{"type", "adamw"},
                    {"step", ts.optimizer_step},
                    {"data_parallel_size", src.world},
                    {"tensor_parallel_size", src.tensor},
                    {"pipeline_parallel_size", src.pipeline},
                    {"sharded", src.sharded},
                    {"files", moment_files},
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
  s["precision"] = {{"recipe", PrecisionName(cfg.precision)},
                    {"master_weights", "fp32"},
                    {"loss_scale", ts.loss_scaler.scale},
                    {"loss_scale_growth_tracker", ts.loss_scaler.growth_tracker},
                    {"loss_scale_hysteresis_tracker", ts.loss_scaler.hysteresis_tracker},
                    {"overflow_skipped_samples", ts.loss_scaler.skipped_samples}};
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

  std::vector<CheckpointFile> files = std::move(tensor_files);
  if (run.meta.tokenizer == "sentencepiece") {
    CheckpointFile tok;
    tok.name = "tokenizer.model";
    KEEL_RETURN_IF_ERROR(
        env->ReadFileToString(SiblingPath(run.data_path, run.meta.tokenizer_model), &tok.bytes));
    s["tokenizer"]["model"] = "tokenizer.model";
    files.push_back(std::move(tok));
  }
  // The tokenizer files Megatron's flags named travel with the checkpoint, so `keel sample` and
  // a resume elsewhere decode with them.
  auto copy = [&](const std::string& from, const std::string& name) -> Status {
    CheckpointFile f;
    f.name = name;
    KEEL_RETURN_IF_ERROR(env->ReadFileToString(from, &f.bytes));
    files.push_back(std::move(f));
    return Status::OK();
  };
  if (run.meta.tokenizer == "hf") {
    const std::string folder = SiblingPath(run.data_path, run.meta.tokenizer_model);
    const bool is_dir = env->IsDirectory(folder);
    const std::string dir = is_dir ? folder : folder.substr(0, folder.rfind('/') + 1);
    KEEL_RETURN_IF_ERROR(
        copy(is_dir ? JoinPath(folder, "tokenizer.json") : folder, "tokenizer.json"));
    for (const char* extra : {"tokenizer_config.json", "special_tokens_map.json"})
      if (env->FileExists(JoinPath(dir, extra)))
        KEEL_RETURN_IF_ERROR(copy(JoinPath(dir, extra), extra));
    s["tokenizer"]["model"] = ".";  // the checkpoint directory is the tokenizer's folder
  }
  if (run.meta.tokenizer == "gpt2" && !run.meta.vocab_file.empty()) {
    KEEL_RETURN_IF_ERROR(copy(run.meta.vocab_file, "gpt2-vocab.json"));
    KEEL_RETURN_IF_ERROR(copy(run.meta.merge_file, "gpt2-merges.txt"));
    s["tokenizer"]["vocab_file"] = "gpt2-vocab.json";
    s["tokenizer"]["merge_file"] = "gpt2-merges.txt";
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
  if (s.is_discarded() || !s.is_object() || !s.contains("format") ||
      s["format"] != "keel-train-state")
    return Status::Corruption(sp + " is not a keel training state; " + kDamagedCheckpointFix);
  JsonReader reader(sp, s, kDamagedCheckpointFix);
  const JsonValue root = reader.root();
  const JsonValue version = root["format_version"];
  if (version.Get<int64_t>(1) != 1)
    return Status::Corruption(sp + ": format_version " + version.raw().dump() +
                              " is not supported by keel " KEEL_VERSION);
  SavedTrainState r;
  r.dir = dir;
  TrainState& t = r.train;
  const JsonValue c = root["counters"];
  t.counters.iteration = c["iteration"].Get<int64_t>();
  t.counters.consumed_samples = c["consumed_samples"].Get<int64_t>();
  t.counters.consumed_tokens = c["consumed_tokens"].Get<int64_t>();
  t.counters.skipped_iterations = c["skipped_iterations"].Get<int64_t>();
  t.counters.nan_iterations = c["nan_iterations"].Get<int64_t>();
  t.counters.data_skipped_iterations = c.Optional("data_skipped_iterations").Get<int64_t>(0);
  for (const char* key :
       {"iteration", "consumed_samples", "consumed_tokens", "skipped_iterations", "nan_iterations"})
    if (reader.ok() && c[key].Get<int64_t>() < 0)
      reader.Fail(c[key].path(), "must be a non-negative integer, but is " + c[key].raw().dump());
  const JsonValue d = root["data"];
  t.data_salt = d.Optional("order_salt").Get<uint64_t>(0);
  for (const JsonValue& p : d.Optional("skipped_iteration_ranges").Items())
    t.skip_ranges.push_back({p[0].Get<int64_t>(), p[1].Get<int64_t>()});
  const JsonValue guard = root.Optional("guard");
  if (guard.present() && !guard.is_null() && !guard.raw().is_object())
    reader.Fail(guard.path(), "must be an object (or null), but is " + DescribeJson(guard.raw()));
  r.guard = guard.raw();
  t.optimizer_step = root["optimizer"]["step"].Get<int64_t>();
  t.lr_scale = root["scheduler"]["lr_scale"].Get<double>();
  // Absent before keel had mixed precision: an fp32 checkpoint, whose scale is 1.
  const JsonValue prec = root.Optional("precision");
  if (prec.present()) {
    t.loss_scaler.scale = prec["loss_scale"].Number();
    t.loss_scaler.growth_tracker = prec["loss_scale_growth_tracker"].Get<int64_t>();
    t.loss_scaler.hysteresis_tracker = prec["loss_scale_hysteresis_tracker"].Get<int64_t>();
    t.loss_scaler.skipped_samples = prec["overflow_skipped_samples"].Get<int64_t>();
    if (reader.ok() && !(t.loss_scaler.scale > 0 && std::isfinite(t.loss_scaler.scale)))
      reader.Fail(prec["loss_scale"].path(),
                  "must be a positive number, but is " + prec["loss_scale"].raw().dump());
  }
  const JsonValue history = root.Optional("history");
  history.Items();  // an array when present
  r.history = history.present() ? history.raw() : json::array();
  const JsonValue iv = root["metrics"]["interval"];
  LogIntervalState& l = t.interval;
  l.loss_sum = iv["loss_sum"].Number();
  l.ms = iv["ms"].Number();
  l.flops = iv["flops"].Number();
  l.iters = iv["iters"].Get<int64_t>();
  l.ok = iv["ok"].Get<int64_t>();
  l.skipped = iv["skipped"].Get<int64_t>();
  l.nan = iv.Optional("nan").Get<int64_t>(0);  // absent before keel counted NaNs apart from skips
  l.samples = iv["samples"].Get<int64_t>();
  for (const JsonValue& v : iv.Optional("dataset_loss_sum").Items())
    l.dataset_loss_sum.push_back(v.Number());
  for (const JsonValue& v : iv.Optional("dataset_sequences").Items())
    l.dataset_sequences.push_back(v.Get<int64_t>());
  const JsonValue model = root["model"];
  const JsonValue tokenizer = root.Optional("tokenizer");
  if (tokenizer.present() && !tokenizer.raw().is_object())
    reader.Fail(tokenizer.path(), "must be an object, but is " + DescribeJson(tokenizer.raw()));
  KEEL_RETURN_IF_ERROR(reader.status());
  if (l.dataset_loss_sum.size() != l.dataset_sequences.size())
    return Status::Corruption(sp +
                              ": metrics.interval: per-dataset sums and counts differ in length");
  KEEL_RETURN_IF_ERROR(SpecFromJson(model.raw(), sp, &r.spec));
  // A model larger than the weights file holds is an edited state.json; building it could take
  // all the memory there is, so it is refused before anything is allocated.
  // (In double: a hand-written layer count times the layer's size may not fit 64 bits.)
  GptSpec no_layer = r.spec;
  no_layer.num_layers = 0;
  const uint64_t outside = GptModel::ParamCount(no_layer);
  no_layer.num_layers = 1;
  const double params =
      static_cast<double>(outside) + static_cast<double>(GptModel::ParamCount(no_layer) - outside) *
                                         static_cast<double>(r.spec.num_layers);
  // (Only when every weights file of its layout is there: a missing one is named by the reader.)
  uint64_t weights_bytes = 0;
  bool found_weights = false;
  int weights_files = 0, layout_files = 0;
  std::string weights_what;
  std::vector<std::string> children;
  if (env->GetChildren(dir, &children).ok())
    for (const std::string& c : children) {
      bool moments = false;
      PieceCoords coords;
      uint64_t size = 0;
      if (ParsePieceFileName(c, &moments, &coords) && !moments &&
          env->GetFileSize(JoinPath(dir, c), &size).ok()) {
        weights_what = found_weights ? "its weights files hold" : c + " holds";
        weights_bytes += size;
        found_weights = true;
        ++weights_files;
        layout_files = coords.tensor * coords.pipeline;
      }
    }
  if (found_weights && weights_files == layout_files &&
      params * sizeof(float) > static_cast<double>(weights_bytes))
    return Status::Corruption(fmt::format(
        "{}: key 'model' describes {:.4g} parameters ({:.4g} bytes of weights) but "
        "{} {} bytes; {}",
        sp, params, params * sizeof(float), weights_what, weights_bytes, kDamagedCheckpointFix));
  const std::string cp = JoinPath(dir, "config.toml");
  KEEL_RETURN_IF_ERROR(env->ReadFileToString(cp, &r.config_text));
  KEEL_RETURN_IF_ERROR(ApplyToml(r.config_text, cp, &r.config));
  r.config.model.vocab = r.spec.vocab;
  r.config.model.padded_vocab = r.spec.padded_vocab;
  // The saved config was valid when it was written; one edited since would reach invariants of
  // the code that rebuilds its schedule (DiffConfigForResume) as an internal error.
  std::vector<std::string> notes;
  if (Status v = Validate(&r.config, &notes); !v.ok())
    return Status::Corruption(fmt::format("{}: the saved config is not valid: {}; {}", cp,
                                          v.message(), kDamagedCheckpointFix));
  r.state = std::move(s);
  *out = std::move(r);
  return Status::OK();
}

Status ReadVerifiedCheckpoint(Env* env, const std::string& dir, SavedTrainState* out) {
  KEEL_RETURN_IF_ERROR(VerifyCheckpointDir(env, dir, /*check_contents=*/true, nullptr));
  return ReadSavedTrainState(env, dir, out);
}

namespace {

// The directory was verified (checksums included) by whoever resolved it: a resume, --load, or
// ResolveCheckpointDir; the reader need not hash its files again.
Status OpenVerified(Env* env, const std::string& dir, CheckpointTensors* out) {
  CheckpointTensors::Options o;
  o.checksums = false;
  return CheckpointTensors::Open(env, dir, o, out);
}

Status CopyWeights(const CheckpointTensors& ckpt, GptModel* model) {
  KEEL_RETURN_IF_ERROR(ckpt.CheckModel(model->spec(), /*moments=*/false));
  Backend* be = model->backend();
  std::vector<float> tmp;
  const int tp = model->tensor_rank(), tensor = model->tensor_size();
  for (const ParamInfo& p : model->params()) {
    tmp.resize(p.numel);
    // Tensor parallel: this rank's slice, from whatever layout's pieces hold it.
    KEEL_RETURN_IF_ERROR(tensor == 1
                             ? ckpt.ReadFull(p.name, tmp.data())
                             : ckpt.Read(p.name, p.split, tp, tensor, 0, p.numel, tmp.data()));
    be->CopyToDevice(model->mutable_param_data() + p.offset, tmp.data(), p.numel);
  }
  return Status::OK();
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
  // Any layout's pieces (checkpoint/tensor_pieces.h): this process holds the whole model (or its
  // tensor rank's slices) and its optimizer's shard of the flat moment buffers.
  CheckpointTensors ckpt;
  KEEL_RETURN_IF_ERROR(OpenVerified(env, saved.dir, &ckpt));
  KEEL_RETURN_IF_ERROR(ckpt.CheckModel(model->spec(), /*moments=*/true));
  KEEL_RETURN_IF_ERROR(CopyWeights(ckpt, model));
  if (const NonFiniteParams nf = FindNonFiniteParams(*model); nf.count > 0)
    return NonFiniteWeightsError(saved.dir, nf, "continue training from",
                                 "`keel train ... --load RUN/iter_N` continues from one");
  Backend* be = model->backend();
  const ShardRange& shard = optimizer->shard();
  std::vector<float> tmp(shard.size());
  for (auto [prefix, dst] : {std::pair<const char*, float*>{"exp_avg.", optimizer->exp_avg()},
                             {"exp_avg_sq.", optimizer->exp_avg_sq()}}) {
    for (const ParamInfo& p : model->params()) {
      const size_t lo = std::max(p.offset, shard.begin);
      const size_t hi = std::min(p.offset + p.numel, shard.end);
      // (Tensor parallel: elements of this rank's slice of the moment tensor.)
      if (lo < hi)
        KEEL_RETURN_IF_ERROR(ckpt.Read(prefix + p.name,
                                       model->tensor_size() > 1 ? p.split : TensorSplit{},
                                       model->tensor_rank(), model->tensor_size(), lo - p.offset,
                                       hi - p.offset, tmp.data() + (lo - shard.begin)));
    }
    be->CopyToDevice(dst, tmp.data(), tmp.size());
  }
  return Status::OK();
}

Status LoadCheckpointWeights(Env* env, const std::string& dir, GptModel* model) {
  CheckpointTensors ckpt;
  KEEL_RETURN_IF_ERROR(OpenVerified(env, dir, &ckpt));
  return CopyWeights(ckpt, model);
}

Status LoadModelFromCheckpoint(Env* env, const std::string& path, Backend* backend,
                               const CheckpointStore::Logger& log, LoadedModel* out) {
  std::string dir;
  KEEL_RETURN_IF_ERROR(ResolveCheckpointDir(env, path, log, NamedCheckpoint::kVerify, &dir));
  out->checkpoint_dir = dir;
  KEEL_RETURN_IF_ERROR(ReadSavedTrainState(env, dir, &out->saved));
  out->model = std::make_unique<GptModel>(backend, out->saved.spec);
  KEEL_RETURN_IF_ERROR(LoadCheckpointWeights(env, dir, out->model.get()));
  if (const NonFiniteParams nf = FindNonFiniteParams(*out->model); nf.count > 0)
    return NonFiniteWeightsError(dir, nf, "load",
                                 "`keel sample --load RUN/iter_N` samples from one");
  const std::string sp = JoinPath(dir, "state.json");
  JsonReader r(sp, out->saved.state, kDamagedCheckpointFix);
  const JsonValue t = r.root()["tokenizer"];
  DatasetMeta meta;
  meta.tokenizer = t.Optional("kind").Get<std::string>();
  meta.eod_id = t.Optional("eod_id").Get<int>(-1);
  meta.vocab_size = t.Optional("vocab_size").Get<int>(0);
  meta.tokenizer_model = t.Optional("model").Get<std::string>();
  const std::string vocab_file = t.Optional("vocab_file").Get<std::string>();
  const std::string merge_file = t.Optional("merge_file").Get<std::string>();
  KEEL_RETURN_IF_ERROR(r.status());
  if (!vocab_file.empty()) meta.vocab_file = JoinPath(dir, vocab_file);
  if (!merge_file.empty()) meta.merge_file = JoinPath(dir, merge_file);
  return LoadTokenizerForDataset(JoinPath(dir, "state"), meta, &out->tokenizer);
}

}  // namespace keel

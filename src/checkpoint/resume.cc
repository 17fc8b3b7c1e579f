#include "checkpoint/resume.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "checkpoint/manifest.h"
#include "checkpoint/train_checkpoint.h"
#include "optim/lr_schedule.h"

namespace keel {

const char* ResumeKindName(ResumePoint::Kind kind) {
  switch (kind) {
    case ResumePoint::Kind::kFresh:
      return "fresh";
    case ResumePoint::Kind::kResume:
      return "resume";
    case ResumePoint::Kind::kRollback:
      return "rollback";
    case ResumePoint::Kind::kLoad:
      return "load";
    case ResumePoint::Kind::kFinetune:
      return "finetune";
  }
  return "?";
}

namespace {

// --load SAVE/iter_N: a checkpoint directory of the run's own --save, so a rollback to N.
bool IsRollbackTarget(Env* env, const TrainConfig& cfg, int64_t* iteration) {
  namespace fs = std::filesystem;
  if (cfg.load.empty() || cfg.save.empty() || !env->FileExists(JoinPath(cfg.load, kManifestFile)))
    return false;
  const fs::path ld = fs::weakly_canonical(fs::path(cfg.load));
  return ld.parent_path() == fs::weakly_canonical(fs::path(cfg.save)) &&
         ParseCheckpointDirName(ld.filename().string(), iteration);
}

// A checkpoint written by `keel ckpt import`: weights with no training run behind them.
bool IsImported(const SavedTrainState& saved) {
  return saved.state.is_object() && saved.state.contains(kImportStateKey);
}

// Whether --load names an imported checkpoint (which always loads as --finetune).
bool LoadsAsFinetune(Env* env, const std::string& load) {
  std::string dir;
  SavedTrainState saved;
  return ResolveCheckpointDir(env, load, nullptr, NamedCheckpoint::kVerify, &dir).ok() &&
         ReadSavedTrainState(env, dir, &saved).ok() && IsImported(saved);
}

bool SameDir(const std::string& a, const std::string& b) {
  namespace fs = std::filesystem;
  std::error_code ec;
  return a == b || fs::weakly_canonical(fs::path(a), ec) == fs::weakly_canonical(fs::path(b), ec);
}

// A checkpoint Megatron-LM or DeepSpeed wrote (iter_N/mp_rank_*, global_step*/, a `latest` tag):
// keel cannot read it, and must not take its iter_N directories for damaged keel checkpoints
// (a resume would set them aside).
Status RefuseForeignCheckpoint(Env* env, const std::string& dir, const char* flag) {
  std::vector<std::string> children;
  if (!env->IsDirectory(dir) || !env->GetChildren(dir, &children).ok()) return Status::OK();
  std::string found;
  for (const std::string& c : children) {
    const std::string path = JoinPath(dir, c);
    int64_t it = 0;
    if (c.rfind("global_step", 0) == 0 && env->IsDirectory(path)) {
      found = path;
    } else if (c == "latest" && !env->IsDirectory(path)) {
      found = path + " (DeepSpeed's tag file)";
    } else if (ParseCheckpointDirName(c, &it) && env->IsDirectory(path) &&
               !env->FileExists(JoinPath(path, kManifestFile))) {
      std::vector<std::string> inner;
      if (env->GetChildren(path, &inner).ok())
        for (const std::string& f : inner)
          if (f.rfind("mp_rank_", 0) == 0 || f == "model_optim_rng.pt") found = JoinPath(path, f);
    }
    if (!found.empty()) break;
  }
  if (found.empty()) return Status::OK();
  return Status::InvalidArgument(fmt::format(
      "{} {} holds a checkpoint written by Megatron-LM or DeepSpeed ({}), which keel cannot "
      "load; keel leaves it untouched: pass a new directory (keel writes its own checkpoints "
      "there, in Megatron's iter_NNNNNNN layout with safetensors files)",
      flag, dir, found));
}

// Why `dir` holds no checkpoint at all ("does not exist", "is empty", ...), or "" when it holds
// something a checkpoint could be (an iter_NNNNNNN directory, a manifest, a marker).
std::string NoCheckpointIn(Env* env, const std::string& dir) {
  if (!env->FileExists(dir)) return "does not exist";
  if (!env->IsDirectory(dir)) return "";  // a file: ResolveCheckpointDir names the problem
  std::vector<std::string> children;
  if (!env->GetChildren(dir, &children).ok()) return "";
  // The locks a run takes before it looks for a checkpoint do not make a directory less empty.
  std::erase(children, std::string(kLocksDir));
  for (const std::string& c : children) {
    int64_t it = 0;
    if (c == kManifestFile || c == kMarkerFile || ParseCheckpointDirName(c, &it)) return "";
  }
  return children.empty() ? "is empty" : "holds no checkpoint (iter_NNNNNNN directory)";
}

Status FindCheckpoint(Env* env, const TrainConfig& cfg, const CheckpointStore::Logger& log,
                      ResumePoint* out) {
  using Kind = ResumePoint::Kind;
  if (!cfg.save.empty()) KEEL_RETURN_IF_ERROR(RefuseForeignCheckpoint(env, cfg.save, "--save"));
  int64_t rollback_to = -1;
  const bool rollback = IsRollbackTarget(env, cfg, &rollback_to);
  // Megatron starts from scratch, with a warning, when --load holds no checkpoint: the first
  // launch of every `--save X --load X` script. So does keel, with a note.
  bool load_empty = false;
  if (!cfg.load.empty() && !rollback) {
    KEEL_RETURN_IF_ERROR(RefuseForeignCheckpoint(env, cfg.load, "--load"));
    const std::string why = NoCheckpointIn(env, cfg.load);
    if (!why.empty()) {
      if (cfg.finetune)
        return Status::InvalidArgument("--finetune loads the weights of --load " + cfg.load +
                                       ", which " + why + ": check the path");
      load_empty = true;
      if (!cfg.save.empty() && !SameDir(cfg.load, cfg.save)) {
        CheckpointStore save_store(env, cfg.save, nullptr);
        std::vector<CheckpointInfo> existing;
        if (save_store.List(&existing).ok() && !existing.empty())
          return Status::InvalidArgument(
              "--load " + cfg.load + " " + why + ", but --save " + cfg.save +
              " holds checkpoints of a run: drop --load to continue that run, or pass a new "
              "--save directory to start afresh");
      }
      out->notes.push_back(fmt::format(
          "--load {} {}: starting from fresh weights, as Megatron does on the first launch of a "
          "`--save X --load X` script",
          cfg.load, why));
    }
  }
  if (rollback) {
    if (cfg.finetune)
      return Status::InvalidArgument(
          "--finetune starts a new run from the weights of --load " + cfg.load +
          ", a checkpoint of --save itself: drop --finetune to roll the run back to it, or give "
          "--save a new directory");
    CheckpointStore store(env, cfg.save, log);
    KEEL_RETURN_IF_ERROR(store.Recover());
    auto saved = std::make_unique<SavedTrainState>();
    KEEL_RETURN_IF_ERROR(ReadVerifiedCheckpoint(
        env, JoinPath(cfg.save, CheckpointDirName(rollback_to)), saved.get()));
    out->kind = Kind::kRollback;
    out->saved = std::move(saved);
    return Status::OK();
  }
  bool resume_finetune = false;  // --save holds the checkpoints of the fine-tuning run to resume
  if (!cfg.load.empty() && !load_empty && !SameDir(cfg.load, cfg.save)) {
    // Another run's newest valid checkpoint, or one of its iter_N directories.
    if (!cfg.save.empty()) {
      CheckpointStore save_store(env, cfg.save, nullptr);
      std::vector<CheckpointInfo> existing;
      if (save_store.List(&existing).ok() && !existing.empty()) {
        // A fine-tuning run started by this same command: it resumes (--load was its start).
        resume_finetune = cfg.finetune || LoadsAsFinetune(env, cfg.load);
        if (!resume_finetune)
          return Status::InvalidArgument(
              "--save " + cfg.save +
              " already holds checkpoints of a run and --load names another directory (" +
              cfg.load +
              "): drop --load to continue the run in --save, give --load one of --save's own "
              "iter_NNNNNNN directories to roll back to it, or pass a new --save directory");
        out->notes.push_back("--save " + cfg.save +
                             " already holds this fine-tuning run's checkpoints: resuming it "
                             "(--load " +
                             cfg.load + " only starts the run)");
      }
    }
    if (!resume_finetune) {
      std::string dir;
      KEEL_RETURN_IF_ERROR(
          ResolveCheckpointDir(env, cfg.load, log, NamedCheckpoint::kVerify, &dir));
      auto saved = std::make_unique<SavedTrainState>();
      KEEL_RETURN_IF_ERROR(ReadSavedTrainState(env, dir, saved.get()));
      out->kind = Kind::kLoad;
      if (cfg.finetune || IsImported(*saved)) out->kind = Kind::kFinetune;
      if (IsImported(*saved) && !cfg.finetune)
        out->notes.push_back(dir +
                             " was imported from Hugging Face (keel ckpt import): loading its "
                             "weights only, as --finetune does (iteration 0, a fresh optimizer, "
                             "this run's schedule and data)");
      out->saved = std::move(saved);
      return Status::OK();
    }
  }
  if (cfg.save.empty()) return Status::OK();  // no --save, no --load: a fresh, unsaved run
  // The run's own --save: leftovers of interrupted saves go, checkpoints that fail verification
  // are set aside (so the run can save their iterations again), the newest valid one is used.
  CheckpointStore store(env, cfg.save, log);
  KEEL_RETURN_IF_ERROR(store.Recover());
  CheckpointInfo info;
  Status st = store.FindNewestValid(/*move_aside_rejected=*/true, &info);
  if (st.code() == Status::Code::kNotFound) return Status::OK();  // a new run in --save
  if (!st.ok())
    return Status::Corruption(
        st.message() + "\nfix or move the broken checkpoints, or pass a new --save directory");
  auto saved = std::make_unique<SavedTrainState>();
  KEEL_RETURN_IF_ERROR(ReadSavedTrainState(env, info.path, saved.get()));
  out->kind = Kind::kResume;
  out->saved = std::move(saved);
  return Status::OK();
}

// The padded vocabulary depends on the tensor-parallel size (a multiple of
// --make-vocab-size-divisible-by x T) but is the model's shape: a checkpoint saved at another T
// keeps its own padding when the new T splits it evenly; otherwise the resume is refused here.
Status AdoptSavedPaddedVocab(const SavedTrainState& saved, TrainConfig* now, ResumePoint* out) {
  const GptSpec& s = saved.config.model;
  const int tensor = std::max(1, now->tensor_model_parallel_size);
  if (s.padded_vocab == now->model.padded_vocab || s.vocab != now->model.vocab ||
      s.padded_vocab < s.vocab || now->pad_vocab_size_to > 0 ||
      saved.config.pad_vocab_size_to != now->pad_vocab_size_to ||
      saved.config.make_vocab_size_divisible_by != now->make_vocab_size_divisible_by)
    return Status::OK();  // another vocabulary or padding setting: the shape check names it
  const int saved_tp = std::max(1, saved.config.tensor_model_parallel_size);
  if (s.padded_vocab % tensor != 0)
    return Status::InvalidArgument(fmt::format(
        "{}: its vocabulary of {} tokens is padded to {} rows (--make-vocab-size-divisible-by {} "
        "x tensor parallel {}), which tensor parallel {} cannot split evenly ({} is not a "
        "multiple of {}); the padded vocabulary is the model's shape and cannot change on "
        "resume: resume at a --tensor-model-parallel-size that divides {}, or start new runs "
        "with --pad-vocab-size-to a multiple of every tensor-parallel size you will use",
        saved.dir, s.vocab, s.padded_vocab, saved.config.make_vocab_size_divisible_by, saved_tp,
        tensor, s.padded_vocab, tensor, s.padded_vocab));
  out->notes.push_back(fmt::format(
      "{} pads the vocabulary of {} tokens to {} rows (saved at tensor parallel {}); tensor "
      "parallel {} would pad to {}: keeping the checkpoint's {} (tensor parallel {} splits it "
      "evenly; the padded vocabulary is the model's shape)",
      saved.dir, s.vocab, s.padded_vocab, saved_tp, tensor, now->model.padded_vocab, s.padded_vocab,
      tensor));
  now->model.padded_vocab = s.padded_vocab;
  out->adopted_padded_vocab = s.padded_vocab;
  return Status::OK();
}

}  // namespace

namespace {
Status ApplyResumeRules(const TrainConfig& cfg, ResumePoint* out);
}  // namespace

Status ResolveResumePoint(Env* env, const TrainConfig& cfg, const CheckpointStore::Logger& log,
                          ResumePoint* out) {
  *out = ResumePoint{};
  KEEL_RETURN_IF_ERROR(FindCheckpoint(env, cfg, log, out));
  if (!out->saved) return Status::OK();
  return ApplyResumeRules(cfg, out);
}

Status ResolveLocalResumePoint(Env* env, const TrainConfig& cfg, const std::string& dir,
                               ResumePoint* out) {
  *out = ResumePoint{};
  auto saved = std::make_unique<SavedTrainState>();
  KEEL_RETURN_IF_ERROR(ReadVerifiedCheckpoint(env, dir, saved.get()));
  out->kind = ResumePoint::Kind::kResume;
  out->local_tier = true;
  out->saved = std::move(saved);
  return ApplyResumeRules(cfg, out);
}

namespace {
Status ApplyResumeRules(const TrainConfig& cfg, ResumePoint* out) {
  TrainConfig now = cfg;
  KEEL_RETURN_IF_ERROR(AdoptSavedPaddedVocab(*out->saved, &now, out));
  const std::vector<ConfigChange> changes = DiffConfigForResume(out->saved->config, now);
  if (out->kind == ResumePoint::Kind::kFinetune) {
    // The weights need a model of their shape; everything else is this run's own.
    std::string refused;
    for (const ConfigChange& c : changes)
      if (c.kind == ConfigChange::Kind::kShape && c.key != "seq-length")
        refused += fmt::format("\n  {}: {} -> {}", c.key, c.old_value, c.new_value);
    if (!refused.empty())
      return Status::InvalidArgument(
          out->saved->dir +
          ": --finetune loads weights into a model of the same shape, and this run's model "
          "differs (checkpoint -> this run):" +
          refused + "\ngive the checkpoint's model settings (its config.toml" +
          (IsImported(*out->saved) ? ", or the import's model.toml" : std::string()) +
          " with --config)");
    if (cfg.finetune)
      out->notes.push_back(fmt::format(
          "--finetune: only the model weights of {} (iteration {}) are loaded; this run starts at "
          "iteration 0 with a fresh optimizer, its own schedule and data",
          out->saved->dir, out->saved->train.counters.iteration));
    return Status::OK();
  }
  Status st = CheckResumeChanges(changes, cfg, &out->accepted, &out->free_changes);
  if (!st.ok()) return Status::InvalidArgument(out->saved->dir + ": " + st.message());
  for (const ConfigChange& c : out->free_changes)
    out->notes.push_back("changed on resume: " + DescribeChange(c));
  return Status::OK();
}
}  // namespace

namespace {

// The model's shape (config/model_shape.h's table; z-loss and reset-* are scheduler and
// data-order changes, below), and the run settings that decide it: the sequence length and the
// vocabulary's padding.
const std::set<std::string>& ShapeKeys() {
  static const std::set<std::string>* keys = [] {
    auto* k = new std::set<std::string>{"seq-length", "make-vocab-size-divisible-by",
                                        "pad-vocab-size-to"};
    for (const ShapeField& f : ShapeFields())
      if (!f.setting.empty() && !f.resumable) k->insert(f.setting);
    return k;
  }();
  return *keys;
}
const std::set<std::string> kSchedulerKeys = {
    "lr",           "min-lr",    "lr-decay-style",    "adam-beta1",        "adam-beta2", "adam-eps",
    "weight-decay", "clip-grad", "global-batch-size", "rampup-batch-size", "z-loss"};
// Warmup and decay lengths are compared in samples (below), whichever form set them.
const std::set<std::string> kScheduleLengthKeys = {"lr-warmup-samples", "lr-warmup-iters",
                                                   "lr-decay-samples", "lr-decay-iters"};
const std::set<std::string> kDataOrderKeys = {"seed",
                                              "data-path",
                                              "split",
                                              "tokenizer",
                                              "reset-position-ids",
                                              "reset-attention-mask",
                                              "tokenizer-type",
                                              "vocab-file",
                                              "merge-file",
                                              "tokenizer-model",
                                              "tokenizer-name-or-path",
                                              "train-weighted-split-paths",
                                              "valid-weighted-split-paths"};
// Settings that only steer this process (where to save, when to stop, how to resume).
const std::set<std::string> kOperationalKeys = {
    "save", "load", "finetune", "override-scheduler", "override-data-order", "lr-scale-on-resume",
    "init-method", "init-method-std",
    // the groups and values read from these files are settings of their own, compared above
    "train-weighted-split-paths-path", "valid-weighted-split-paths-path", "deepspeed",
    "deepspeed-config"};

}  // namespace

ConfigChange::Kind ResumeKindOfKey(const std::string& key) {
  using K = ConfigChange::Kind;
  if (ShapeKeys().count(key)) return K::kShape;
  if (kSchedulerKeys.count(key) || kScheduleLengthKeys.count(key)) return K::kScheduler;
  if (kDataOrderKeys.count(key)) return K::kDataOrder;
  return K::kFree;
}

std::vector<ConfigChange> DiffConfigForResume(const TrainConfig& saved, const TrainConfig& now) {
  using K = ConfigChange::Kind;
  std::vector<ConfigChange> out;
  const auto a = ConfigValues(saved), b = ConfigValues(now);
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const std::string& key = a[i].first;
    if (a[i].second == b[i].second || kScheduleLengthKeys.count(key) || kOperationalKeys.count(key))
      continue;
    out.push_back({ResumeKindOfKey(key), key, a[i].second, b[i].second});
  }
  const LrSchedule sa = LrSchedule::FromConfig(saved), sb = LrSchedule::FromConfig(now);
  if (sa.warmup_samples() != sb.warmup_samples())
    out.push_back({K::kScheduler, "lr warmup (samples)", std::to_string(sa.warmup_samples()),
                   std::to_string(sb.warmup_samples())});
  if (sa.decay_samples() != sb.decay_samples())
    out.push_back({K::kScheduler, "lr decay (samples)", std::to_string(sa.decay_samples()),
                   std::to_string(sb.decay_samples())});
  if (saved.model.padded_vocab != now.model.padded_vocab || saved.model.vocab != now.model.vocab)
    out.push_back({K::kShape, "vocabulary (from the data)",
                   fmt::format("{} (padded {})", saved.model.vocab, saved.model.padded_vocab),
                   fmt::format("{} (padded {})", now.model.vocab, now.model.padded_vocab)});
  return out;
}

std::string DescribeChange(const ConfigChange& c) {
  return fmt::format("{}: {} -> {}", c.key, c.old_value, c.new_value);
}

Status CheckResumeChanges(const std::vector<ConfigChange>& changes, const TrainConfig& now,
                          std::vector<ConfigChange>* accepted, std::vector<ConfigChange>* free) {
  using K = ConfigChange::Kind;
  std::string refused;
  bool shape = false, sched = false, data = false;
  accepted->clear();
  free->clear();
  for (const ConfigChange& c : changes) {
    const std::string line = fmt::format("\n  {}: {} -> {}", c.key, c.old_value, c.new_value);
    switch (c.kind) {
      case K::kShape:
        shape = true;
        refused += line + "  (model shape: cannot change on resume)";
        break;
      case K::kScheduler:
        if (now.override_scheduler) {
          accepted->push_back(c);
        } else {
          sched = true;
          refused += line + "  (accept with --override-scheduler)";
        }
        break;
      case K::kDataOrder:
        if (now.override_data_order) {
          accepted->push_back(c);
        } else {
          data = true;
          refused += line + "  (accept with --override-data-order)";
        }
        break;
      case K::kFree:
        free->push_back(c);
        break;
    }
  }
  if (refused.empty()) return Status::OK();
  std::string fix;
  if (shape)
    fix =
        "the model's shape is fixed by the checkpoint: restore the old values, or start a new "
        "run with a new --save";
  else if (sched && data)
    fix =
        "pass --override-scheduler and --override-data-order to accept these changes, or "
        "restore the old values";
  else if (sched)
    fix =
        "pass --override-scheduler to accept them (or --lr-scale-on-resume S to scale the LR "
        "without changing the schedule), or restore the old values";
  else
    fix =
        "pass --override-data-order to accept them (the data order changes from here on), or "
        "restore the old values";
  return Status::InvalidArgument(
      "the config differs from the checkpoint's (old -> new):" + refused + "\n" + fix);
}

}  // namespace keel

#include "train/training_run.h"

#include <fmt/format.h>

#include <chrono>
#include <tuple>

#include "backend/registry.h"
#include "checkpoint/manifest.h"
#include "core/json_reader.h"
#include "core/log.h"
#include "core/stop_signal.h"
#include "core/timestamp.h"
#include "data/blended_dataset.h"
#include "data/default_corpus.h"
#include "data/megatron_tokenizer.h"
#include "data/prepare.h"
#include "journal/run_journal.h"
#include "model/flops.h"
#include "model/generate.h"
#include "train/memory_estimate.h"
#include "train/rank_agreement.h"

namespace keel {

namespace {

void LogTo(const std::string& line) {
  LogLine(line);
}

}  // namespace

const char* OutcomeName(TrainingRun::Outcome outcome) {
  switch (outcome) {
    case TrainingRun::Outcome::kFinished:
      return "finished";
    case TrainingRun::Outcome::kAlreadyComplete:
      return "already complete";
    case TrainingRun::Outcome::kStopped:
      return "stopped";
    case TrainingRun::Outcome::kNotStarted:
      return "not started";
    case TrainingRun::Outcome::kGuardStopped:
      return "stopped by the guard";
  }
  return "?";
}

TrainingRun::TrainingRun(const TrainConfig& config, const RunOptions& options)
    : cfg_(config),
      env_(options.env),
      health_(std::make_unique<RunHealth>(options.env, options.comm, options.test_hooks)),
      comm_(health_->comm()),
      test_hooks_(options.test_hooks) {}

TrainingRun::~TrainingRun() {
  // The log's copy to SAVE/logs/rank-NNN.log writes to rank_log_, which goes with this run; the
  // caller may still log (the error that ended the run).
  if (rank_log_)
    SetLogCopy(nullptr, /*mute_stdout=*/comm_->rank() != 0,
               fmt::format("[rank {}] ", comm_->rank()));
}

namespace {

// std::bad_alloc as the user reads it: what keel was doing and what to change.
Status OutOfMemory(const std::string& doing) {
  return Status::OutOfMemory(
      "out of memory while " + doing +
      ": reduce --micro-batch-size, --seq-length or the model (--num-layers, --hidden-size), or "
      "free memory on this machine (the memory estimate above counts what keel allocates for "
      "the model, the optimizer, one micro-batch and the data read-ahead)");
}

}  // namespace

Status TrainingRun::Open(const TrainConfig& config, const RunOptions& options,
                         std::unique_ptr<TrainingRun>* out) {
  std::string doing = "opening the run";
  try {
    return OpenSteps(config, options, out, &doing);
  } catch (const std::bad_alloc&) {
    return OutOfMemory(doing);
  }
}

Status TrainingRun::OpenSteps(const TrainConfig& config, const RunOptions& options,
                              std::unique_ptr<TrainingRun>* out, std::string* doing) {
  KEEL_CHECK(options.env != nullptr && options.comm != nullptr, "a run needs an Env and a comm");
  std::unique_ptr<TrainingRun> run(new TrainingRun(config, options));
  TrainingRun& r = *run;
  // Defaults that depend on the data-parallel size and the vocabulary (global batch, padded
  // vocab) are derived once both are known, from the config as the user gave it.
  r.cfg_.data_parallel_size = r.comm_->world_size();
  // The ranks run one job (the same settings, one directory, no other job in it), and the run
  // directory is checked before any work, so a long run never fails at its end.
  KEEL_RETURN_IF_ERROR(AgreeOnConfig(r.comm_, r.cfg_));
  KEEL_RETURN_IF_ERROR(r.comm_->AgreeOnStatus(r.PrepareRunDirectory()));
  if (!r.cfg_.save.empty()) {
    std::vector<std::string> lock_notes;
    KEEL_RETURN_IF_ERROR(
        RunDirectoryLock::Acquire(r.env_, r.comm_, r.cfg_.save, &r.dir_lock_, &lock_notes));
    for (const std::string& n : lock_notes) Log("note: {}", n);
  }
  KEEL_RETURN_IF_ERROR(r.OpenRankLog());
  // Every rank takes the same decision (one of them may see the file appear first).
  double kill_switch =
      !r.cfg_.kill_switch_path.empty() && r.env_->FileExists(r.cfg_.kill_switch_path) ? 1 : 0;
  r.comm_->AllReduceMaxHost(&kill_switch, 1);
  if (kill_switch > 0) {
    Warn("kill switch {} exists: not training (remove the file to train)", r.cfg_.kill_switch_path);
    r.not_started_ = true;
    *out = std::move(run);
    return Status::OK();
  }
  std::vector<std::string> notes;
  *doing = "opening the data";
  KEEL_RETURN_IF_ERROR(r.OpenData(&notes));
  KEEL_RETURN_IF_ERROR(Validate(&r.cfg_, &notes));
  KEEL_RETURN_IF_ERROR(r.health_->Start(r.cfg_));
  const Status fits = r.CheckMemory(&notes);
  for (const std::string& n : notes) Log("note: {}", n);
  KEEL_RETURN_IF_ERROR(fits);
  r.LogData();

  KEEL_RETURN_IF_ERROR(r.ResolveResumeOnEveryRank());
  for (const std::string& n : r.resume_.notes) Log("note: {}", n);
  if (r.resume_.kind == ResumePoint::Kind::kFinetune) {
    // A new run from another's weights: its history (an import's provenance) and where it began.
    const SavedTrainState& saved = *r.resume_.saved;
    r.history_ = saved.history;
    r.history_.push_back({{"event", "finetune"},
                          {"iteration", 0},
                          {"at", UtcTimestamp()},
                          {"from", saved.dir},
                          {"from_iteration", saved.train.counters.iteration},
                          {"keel_version", KEEL_VERSION}});
  } else if (r.resume_.saved) {
    const SavedTrainState& saved = *r.resume_.saved;
    const bool rollback = r.resume_.kind == ResumePoint::Kind::kRollback;
    r.history_ = saved.history;
    nlohmann::json event = {{"event", rollback ? "rollback" : "resume"},
                            {"iteration", saved.train.counters.iteration},
                            {"at", UtcTimestamp()},
                            {"from", saved.dir},
                            {"keel_version", KEEL_VERSION}};
    for (const ConfigChange& c : r.resume_.accepted) {
      Log("accepted change on resume: {}: {} -> {} ({})", c.key, c.old_value, c.new_value,
          c.kind == ConfigChange::Kind::kScheduler ? "--override-scheduler"
                                                   : "--override-data-order");
      event["accepted_changes"].push_back(
          {{"key", c.key}, {"old", c.old_value}, {"new", c.new_value}});
    }
    // Free changes (a precision, the log interval, ...) need no flag but go into the chronicle.
    for (const ConfigChange& c : r.resume_.free_changes)
      event["free_changes"].push_back(DescribeChange(c));
    r.history_.push_back(event);
  }

  Log("resolved config:\n{}", FormatConfig(r.cfg_));
  *doing = "building the model and the optimizer";
  KEEL_RETURN_IF_ERROR(MakeBackend(r.cfg_.backend, r.cfg_.threads, &r.backend_));
  // A config that needs an op the backend lacks stops here, naming both, not mid-iteration.
  KEEL_RETURN_IF_ERROR(CheckBackendSupports(*r.backend_, r.cfg_.model, r.cfg_.precision));
  r.backend_->SetPrecision(r.cfg_.precision);  // the trainer sets it too; the log says it now
  Log("backend: {}", r.backend_->Describe());
  r.trainer_ = std::make_unique<Trainer>(r.cfg_, r.backend_.get(), r.comm_, r.MakeTrainerData());
  r.LogSkippedSampleRanges();
  if (r.test_hooks_ != nullptr) {
    r.trainer_->set_gradient_fault(r.test_hooks_->GradientFault(r.backend_.get()));
    r.trainer_->set_lr_fault(r.test_hooks_->LrFault());
    r.trainer_->set_corrupt_fault(r.test_hooks_->CorruptFault(r.comm_->rank()));
  }
  const GptSpec& spec = r.trainer_->model().spec();
  const int64_t formula = GptModel::FormulaParamCount(spec);
  Log("model: {} layers, hidden {}, ffn {}{}, heads {}{}, positions {}, {}, vocab {} (padded {}){}",
      spec.num_layers, spec.hidden, spec.ffn_hidden, spec.swiglu ? " SwiGLU" : " GELU", spec.heads,
      spec.KvHeads() != spec.heads ? fmt::format(" ({} key/value)", spec.KvHeads()) : "",
      spec.alibi  ? std::string("ALiBi")
      : spec.rope ? DescribeRope(spec)
                  : fmt::format("learned {}", spec.max_positions),
      spec.rmsnorm ? "RMSNorm" : "LayerNorm", spec.vocab, spec.padded_vocab,
      std::string(spec.untie_embeddings ? ", untied output layer" : "") +
          (spec.bias ? "" : ", no linear biases"));
  if (GptModel::IsGpt2Shape(spec)) {
    Log("parameters: {} (formula n*(12h^2+13h) + v*h + s*h + 2h = {}{})",
        r.trainer_->model().num_params(), formula,
        static_cast<int64_t>(r.trainer_->model().num_params()) == formula
            ? ", equal"
            : ": differs because of the FFN size");
  } else {
    Log("parameters: {} (from the model's layout; GPT-2's formula n*(12h^2+13h) + v*h + s*h + 2h "
        "= {} does not describe this shape)",
        r.trainer_->model().num_params(), formula);
  }
  if (r.comm_->world_size() > 1) {
    const AdamW& opt = r.trainer_->optimizer();
    Log("optimizer: {}: this rank holds the Adam moments of {} of {} parameters ({})",
        r.trainer_->sharded_optimizer() ? "ZeRO-1 (--use-distributed-optimizer)"
                                        : "replicated (--use-distributed-optimizer=false)",
        opt.shard().size(), opt.num_params(), FormatBytes(2 * opt.shard().size() * sizeof(float)));
  }
  Log("training: {} iterations, {} flops per token", r.trainer_->TotalIterations(),
      fmt::format("{:.3g}", TrainingFlopsPerToken(spec, r.cfg_.seq_length)));

  *doing = r.resume_.saved ? "loading the checkpoint" : "initializing the weights";
  KEEL_RETURN_IF_ERROR(r.StartFromResumePoint());
  *doing = "opening the journal, the metrics and the guard";
  KEEL_RETURN_IF_ERROR(r.OpenJournalMetricsAndGuard());
  *out = std::move(run);
  return Status::OK();
}

Status TrainingRun::OpenRankLog() {
  if (comm_->world_size() == 1) return Status::OK();
  const int rank = comm_->rank();
  if (!cfg_.save.empty()) {
    const std::string dir = JoinPath(cfg_.save, "logs");
    const std::string path = JoinPath(dir, fmt::format("rank-{:03d}.log", rank));
    Status st = env_->CreateDirs(dir);
    if (st.ok()) st = env_->NewAppendableFile(path, &rank_log_);
    KEEL_RETURN_IF_ERROR(comm_->AgreeOnStatus(st));
    rank_log_->Append(fmt::format("==== keel {} rank {} of {} started {} ====\n", KEEL_VERSION,
                                  rank, comm_->world_size(), UtcTimestamp()));
  }
  WritableFile* f = rank_log_.get();
  SetLogCopy(f == nullptr ? std::function<void(const std::string&)>()
                          : [f](const std::string& line) {
                              (void)f->Append(line + "\n");
                              (void)f->Flush();
                            },
             /*mute_stdout=*/rank != 0, fmt::format("[rank {}] ", rank));
  Log("data parallel: {}{}", comm_->Describe(),
      cfg_.save.empty()
          ? ""
          : fmt::format("; this rank logs to {}/logs/rank-{:03d}.log", cfg_.save, rank));
  return Status::OK();
}

Status TrainingRun::ResolveResumeOnEveryRank() {
  // Rank 0 first: it may tidy the run directory (remove an interrupted save, move a corrupt
  // checkpoint aside, adopt an uncommitted one); the others then read the tidied directory.
  Status st;
  if (comm_->rank() == 0) st = ResolveResumePoint(env_, cfg_, LogTo, &resume_);
  st = comm_->AgreeOnStatus(st);
  if (st.ok() && comm_->rank() != 0) st = ResolveResumePoint(env_, cfg_, LogTo, &resume_);
  KEEL_RETURN_IF_ERROR(comm_->AgreeOnStatus(st));
  KEEL_RETURN_IF_ERROR(NoteDataParallelChange());
  if (comm_->world_size() == 1) return Status::OK();
  const int64_t mine = resume_.saved ? resume_.saved->train.counters.iteration : -1;
  std::vector<std::string> all;
  comm_->AllGatherBytes(std::to_string(mine), &all);
  for (size_t r = 1; r < all.size(); ++r)
    if (all[r] != all[0])
      return Status::IOError(fmt::format(
          "the ranks found different checkpoints to continue from (rank 0: iteration {}, rank "
          "{}: iteration {}): every rank must see the same --save directory (a shared "
          "filesystem when the ranks run on several machines)",
          all[0], r, all[r]));
  return Status::OK();
}

Status TrainingRun::NoteDataParallelChange() {
  if (resume_.continues_run()) {
    JsonReader reader(JoinPath(resume_.saved->dir, "state.json"), resume_.saved->state);
    const int saved_dp = reader.root()["optimizer"]
                             .Optional("data_parallel_size")
                             .Get<int>(1);  // older checkpoints: one process
    KEEL_RETURN_IF_ERROR(reader.status());
    if (saved_dp != comm_->world_size())
      Log("note: {} was saved by {} data-parallel rank{}; this run has {}: each rank loads the "
          "Adam moments of its new shard (no conversion step); the global batch and the sample "
          "order are unchanged",
          resume_.saved->dir, saved_dp, saved_dp == 1 ? "" : "s", comm_->world_size());
  }
  return Status::OK();
}

Status TrainingRun::CheckMemory(std::vector<std::string>* notes) {
  // Before any of it is allocated: a model or micro-batch that cannot fit is refused here, with
  // what would fit, instead of being killed (or failing in std::bad_alloc) later.
  const MemoryEstimate estimate = EstimateRunMemory(cfg_);
  MemoryAvailable available;
  if (!env_->AvailableMemory(&available).ok()) {
    notes->push_back(fmt::format(
        "memory estimate {}: {}; the available memory is unknown here, so it is not checked",
        FormatBytes(estimate.total()), DescribeMemoryEstimate(cfg_, estimate)));
    return Status::OK();
  }
  notes->push_back(fmt::format(
      "memory estimate {}: {}; available {} ({})", FormatBytes(estimate.total()),
      DescribeMemoryEstimate(cfg_, estimate), FormatBytes(available.bytes), available.source));
  return CheckMemoryFits(cfg_, estimate, available);
}

Status TrainingRun::PrepareRunDirectory() {
  if (cfg_.save.empty()) return Status::OK();
  if (env_->FileExists(JoinPath(cfg_.save, "run.json")) &&
      !env_->FileExists(JoinPath(cfg_.save, kMarkerFile)))
    return Status::InvalidArgument(
        "--save " + cfg_.save +
        " holds a run written by an older keel (run.json, no checkpoints) that cannot be "
        "resumed; pass a new --save directory");
  // One probe file per rank: ranks of one job probe the same directory at once.
  const std::string probe =
      JoinPath(cfg_.save, comm_->world_size() == 1
                              ? std::string(".keel-write-test")
                              : fmt::format(".keel-write-test.rank-{:03d}", comm_->rank()));
  Status st = env_->CreateDirs(cfg_.save);
  if (st.ok()) st = WriteFileAtomic(env_, probe, "ok\n");
  if (st.ok()) st = env_->RemoveFile(probe);
  if (!st.ok())
    return Status::InvalidArgument("--save " + cfg_.save + " is not writable: " + st.message());
  return Status::OK();
}

Status TrainingRun::OpenData(std::vector<std::string>* notes) {
  DataSpec spec;
  spec.split = cfg_.split;
  spec.seq_length = cfg_.seq_length;
  spec.seed = cfg_.seed;
  if (!cfg_.train_weighted_split_paths.empty()) {
    for (auto [flag, texts, groups] :
         {std::tuple{"--train-weighted-split-paths", &cfg_.train_weighted_split_paths,
                     &spec.train_groups},
          {"--valid-weighted-split-paths", &cfg_.valid_weighted_split_paths, &spec.valid_groups}})
      for (const std::string& text : *texts) {
        groups->emplace_back();
        KEEL_RETURN_IF_ERROR(ParseWeightedSplitGroup(text, flag, &groups->back()));
      }
  } else if (cfg_.data_path.empty()) {  // (a lone "" is normalised away by the config)
    std::string prefix;
    const std::string tok = cfg_.tokenizer == TokenizerKind::kGpt2 ? "gpt2" : "sentencepiece";
    KEEL_RETURN_IF_ERROR(EnsureDefaultCorpus(env_, tok, 4096, &prefix, notes));
    spec.blend.emplace_back(1.0, prefix);
  } else {
    KEEL_RETURN_IF_ERROR(ParseDataBlend(cfg_.data_path, &spec.blend));
  }
  // Megatron's tokenizer flags: the tokenizer of data without keel metadata.
  DatasetMeta flags_meta;
  if (!cfg_.tokenizer_type.empty()) {
    const TokenizerSpec ts{cfg_.tokenizer_type, cfg_.vocab_file, cfg_.merge_file,
                           cfg_.tokenizer_model, cfg_.tokenizer_name_or_path};
    std::unique_ptr<Tokenizer> tok;
    KEEL_RETURN_IF_ERROR(LoadTokenizerFromSpec(env_, ts, &tok, notes));
    flags_meta = MetaForSpec(ts, *tok);
    spec.flags_tokenizer = &flags_meta;
    spec.flags_text = DescribeSpec(ts);
  }
  KEEL_RETURN_IF_ERROR(TrainData::Open(env_, spec, &data_, notes));
  prefix_ = data_->source(0).shards[0];  // its tokenizer is the run's
  meta_ = data_->meta();
  if (meta_.vocab_size <= 0)
    return Status::InvalidArgument(prefix_ + ".meta.json gives no vocabulary size for " + prefix_ +
                                   ": prepare the data again with `keel data prepare`");
  cfg_.model.vocab = meta_.vocab_size;
  cfg_.model.eod_id = meta_.eod_id;
  if ((cfg_.model.reset_position_ids || cfg_.model.reset_attention_mask) && meta_.eod_id < 0)
    return Status::InvalidArgument(
        "--reset-position-ids / --reset-attention-mask find documents by their end-of-document "
        "token, but " +
        prefix_ +
        ".meta.json names none; prepare the data with `keel data prepare` (it records the EOD "
        "id) or drop the flags");
  return Status::OK();
}

void TrainingRun::LogData() {
  const bool mixture = data_->NumDatasets() > 1;
  for (int d = 0; d < data_->NumDatasets(); ++d) {
    const TrainData::Source& src = data_->source(d);
    Log("data: {} ({}{} documents, {} tokens; train split {}{} samples of {} tokens per epoch{})",
        mixture ? fmt::format("{} = {} (weight {:.4f})", src.name, src.prefix, src.weight)
                : src.prefix,
        src.shards.size() > 1 ? fmt::format("{} shards, ", src.shards.size()) : "",
        src.data->NumDocuments(), src.data->NumTokens(), src.range.empty() ? "" : src.range + ", ",
        src.train->SamplesPerEpoch(), cfg_.seq_length,
        src.valid ? fmt::format(", validation split {} samples", src.valid->SamplesPerEpoch())
                  : "");
    if (!src.valid && data_->CombineValidation())
      Warn("no validation set for {} ({}); it is not evaluated", src.name, src.valid_missing);
  }
  if (mixture)
    Log("data: mixture of {} datasets by error diffusion over the weights: over any window of N "
        "samples each dataset gets its share within 2 samples; the order is a pure function of "
        "(seed, position)",
        data_->NumDatasets());
  if (!data_->CombineValidation())
    for (int v = 0; v < data_->NumValidSets(); ++v)
      Log("data: validation group {}: {} samples of {} tokens per epoch, evaluated on its own",
          data_->ValidSetName(v), data_->ValidSetSamples(v), cfg_.seq_length);
  for (int v = 0; v < data_->NumValidSets(); ++v)
    if (cfg_.eval_iters * cfg_.global_batch_size > data_->ValidSetSamples(v))
      Warn(
          "an evaluation of {} reads --eval-iters {} x global batch {} = {} samples but its "
          "validation split has {}: samples repeat within an evaluation; lower --eval-iters or "
          "give the validation split more weight in --split",
          data_->ValidSetName(v), cfg_.eval_iters, cfg_.global_batch_size,
          cfg_.eval_iters * cfg_.global_batch_size, data_->ValidSetSamples(v));
  if (data_->NumValidSets() == 0) Warn("no dataset has a validation split: validation is skipped");
}

TrainerData TrainingRun::MakeTrainerData() {
  // Samples are read ahead on background threads (data/sample_prefetcher.h); the loop's own
  // thread sees each sample's dataset and epoch, and logs a dataset's new epoch as it begins.
  const int64_t depth = SamplePrefetchDepth(cfg_);
  prefetcher_ = std::make_unique<SamplePrefetcher>(
      [this](int64_t index, uint64_t salt, int32_t* tokens) {
        return data_->GetTrainSample(index, salt, tokens);
      },
      cfg_.seq_length + 1, depth, cfg_.num_workers);
  last_epoch_.assign(static_cast<size_t>(data_->NumDatasets()), -1);
  TrainerData td;
  td.train = [this](int64_t index, int32_t* tokens) { return ReadTrainSample(index, tokens); };
  td.combine_validation = data_->CombineValidation();
  if (data_->NumDatasets() == 1 && data_->CombineValidation()) {
    if (data_->NumValidSets() == 1)
      td.valid = [this](int64_t index, int32_t* tokens) {
        return ReadValidSample(0, index, tokens);
      };
    return td;
  }
  td.dataset_names = data_->Names();
  for (int v = 0; v < data_->NumValidSets(); ++v)
    td.valid_sets.push_back(
        {data_->ValidSetName(v), data_->ValidSetWeight(v),
         [this, v](int64_t index, int32_t* tokens) { return ReadValidSample(v, index, tokens); }});
  return td;
}

int TrainingRun::ReadValidSample(int v, int64_t index, int32_t* tokens) {
  CheckTokens(data_->GetValidSample(v, index, tokens), tokens, /*train=*/false, index);
  return v;
}

void TrainingRun::CheckTokens(const SampleOrigin& o, const int32_t* tokens, bool train,
                              int64_t index) {
  // Against the tokenizer's vocabulary, not the padded one: an id in the padding would train a
  // row the output never predicts. One unsigned compare per token also catches negative ids.
  const uint32_t vocab = static_cast<uint32_t>(cfg_.model.vocab);
  int bad = -1;
  for (int t = 0; t <= cfg_.seq_length && bad < 0; ++t)
    if (static_cast<uint32_t>(tokens[t]) >= vocab) bad = t;
  if (bad < 0) return;
  const TokenLocation l = data_->Locate(o, bad);
  const int64_t it = trainer_->state().counters.iteration;
  data_error_ = true;
  throw KeelError(Status::InvalidArgument(fmt::format(
      "dataset {} (--data-path {}{}): token {} of document {} is id {}, outside the vocabulary "
      "[0, {}) of its tokenizer ({}); it was read as {} sample {} {} {}. The data was prepared "
      "with another tokenizer, or is corrupt: `keel data verify {}` lists every such id; prepare "
      "it again with the tokenizer it is meant for (`keel data prepare --tokenizer ...`)",
      l.name, l.prefix, l.sharded ? ", shard " + l.shard : "", l.token, l.document, tokens[bad],
      cfg_.model.vocab, meta_.tokenizer.empty() ? "unknown" : meta_.tokenizer,
      train ? "training" : "validation", index,
      train ? "of iteration" : "of the evaluation after iteration", train ? it + 1 : it, l.shard)));
}

int TrainingRun::ReadTrainSample(int64_t index, int32_t* tokens) {
  const TrainState& state = trainer_->state();
  if (test_hooks_ != nullptr && test_hooks_->Poisoned(state.counters.iteration + 1)) {
    TestHooks::PoisonSample(cfg_.seed, index, cfg_.seq_length, cfg_.model.vocab, tokens);
    return 0;
  }
  // The guard's re-seeding rung raises the data salt: from then on the samples come from the
  // same splits in the order of seed + salt.
  if (state.data_salt != last_salt_) {
    Log("data: order re-seeded (salt {}) from sample {}", state.data_salt, index);
    last_salt_ = state.data_salt;
  }
  const SampleOrigin o = prefetcher_->Get(index, state.data_salt, tokens);
  CheckTokens(o, tokens, /*train=*/true, index);
  int64_t& seen = last_epoch_[static_cast<size_t>(o.dataset)];
  if (o.epoch != seen) {
    const TrainData::Source& src = data_->source(o.dataset);
    if (seen >= 0 && o.epoch > seen)
      Log("data: {} exhausted after {} epoch(s) of {} samples; epoch {} begins with a new "
          "deterministic order (run sample {})",
          src.name, o.epoch, src.train->SamplesPerEpoch(), o.epoch + 1, index);
    else if (o.epoch > 0)
      Log("data: {} is in epoch {} (run sample {})", src.name, o.epoch + 1, index);
    seen = o.epoch;
  }
  return o.dataset;
}

void TrainingRun::LogSkippedSampleRanges() {
  // Iteration ranges are journaled with the guard's; here the iterations the sample ranges
  // stand for.
  std::vector<std::pair<int64_t, int64_t>> sample_ranges;
  (void)ParseSampleRanges(cfg_.skip_train_samples_range, &sample_ranges);  // validated
  for (auto [a, b] : sample_ranges) {
    const IterationRange r = trainer_->IterationsReading(a, b);
    if (r.first > 0)
      Log("data: iterations {}..{} will be skipped (--skip-train-samples-range {}-{})", r.first,
          r.last, a, b);
    else
      Warn("--skip-train-samples-range {}-{} lies past the end of this run: nothing to skip", a, b);
  }
}

Status TrainingRun::StartFromResumePoint() {
  if (!cfg_.save.empty()) {
    store_ = std::make_unique<CheckpointStore>(env_, cfg_.save, LogTo);
    store_->set_read_only(comm_->rank() != 0);  // rank 0 owns the run directory's shared files
  }
  RunInfo run_info{prefix_, meta_, nlohmann::json::array()};
  for (int d = 0; d < data_->NumDatasets(); ++d)
    run_info.datasets.push_back({{"name", data_->source(d).name},
                                 {"prefix", data_->source(d).prefix},
                                 {"shards", data_->source(d).shards},
                                 {"weight", data_->source(d).weight}});
  ckpt_ = std::make_unique<CheckpointController>(cfg_, env_, store_.get(), trainer_.get(), run_info,
                                                 history_, LogTo);
  if (!resume_.saved) {
    trainer_->InitializeWeights();
    if (!cfg_.save.empty()) Log("no checkpoint in {}: starting from fresh weights", cfg_.save);
  } else if (resume_.kind == ResumePoint::Kind::kFinetune) {
    const SavedTrainState& saved = *resume_.saved;
    const auto l0 = std::chrono::steady_clock::now();
    KEEL_RETURN_IF_ERROR(comm_->AgreeOnStatus(LoadWeightsOnly(env_, saved, trainer_.get())));
    const double ls = std::chrono::duration<double>(std::chrono::steady_clock::now() - l0).count();
    Log("fine-tuning from {}: its model weights (iteration {}) only; iteration 0, a fresh "
        "optimizer, next LR {:.6E} (loaded in {:.2f} s)",
        saved.dir, saved.train.counters.iteration, trainer_->NextLr(), ls);
  } else {
    const SavedTrainState& saved = *resume_.saved;
    const auto l0 = std::chrono::steady_clock::now();
    if (resume_.kind == ResumePoint::Kind::kRollback) {
      std::vector<std::string> kept;
      KEEL_RETURN_IF_ERROR(ckpt_->RollbackTo(saved, &kept));
    } else {
      KEEL_RETURN_IF_ERROR(ckpt_->Restore(saved, resume_.in_save_dir()));
    }
    const double ls = std::chrono::duration<double>(std::chrono::steady_clock::now() - l0).count();
    if (saved.config.precision != cfg_.precision) {
      // Master weights and moments are fp32 in every precision; only fp16's loss scaler is new
      // (or dropped).
      trainer_->ResetLossScaler();
      if (cfg_.precision == Precision::kFp16)
        Log("the checkpoint was trained in {}: the fp16 loss scaler starts at {:g}",
            PrecisionName(saved.config.precision), trainer_->loss_scaler()->scale());
    }
    const TrainState& s = trainer_->state();
    Log("resumed from {}: iteration {}, consumed samples {}, optimizer step {}, next LR {:.6E}, "
        "LR scale {} (loaded in {:.2f} s)",
        saved.dir, s.counters.iteration, s.counters.consumed_samples, s.optimizer_step,
        trainer_->NextLr(), s.lr_scale, ls);
  }
  if (store_) InstallStopSignalHandlers();
  return Status::OK();
}

Status TrainingRun::OpenJournalMetricsAndGuard() {
  // A fine-tuning run starts afresh: no counters, metrics or guard state of the checkpoint's.
  const SavedTrainState* saved = resume_.continues_run() ? resume_.saved.get() : nullptr;
  const bool rollback = resume_.kind == ResumePoint::Kind::kRollback;
  const int64_t start_iteration = trainer_->state().counters.iteration;
  // Rank 0 writes the chronicle, metrics.jsonl and TensorBoard; the other ranks keep them in
  // memory (the same decisions, one record of them).
  const std::string shared_dir = comm_->rank() == 0 ? cfg_.save : std::string();
  journal_ = std::make_unique<RunJournal>(env_, shared_dir, LogTo);
  journal_->Heading(fmt::format("{} at iteration {} ({}, keel {})",
                                saved ? (rollback ? "rolled back" : "resumed") : "started",
                                start_iteration, UtcTimestamp(), KEEL_VERSION));
  if (saved) {
    std::string changes;
    for (const auto& c : history_.back().value("free_changes", nlohmann::json::array()))
      changes += (changes.empty() ? "; changed: " : ", ") + c.get<std::string>();
    journal_->Append(
        history_.back(),
        fmt::format("{} from {} at iteration {}{}", rollback ? "rolled back by hand" : "resumed",
                    saved->dir, saved->train.counters.iteration, changes));
  } else if (resume_.kind == ResumePoint::Kind::kFinetune) {
    journal_->Append(history_.back(),
                     fmt::format("fine-tuning from the weights of {} (its iteration {})",
                                 resume_.saved->dir, resume_.saved->train.counters.iteration));
  }
  // Metrics: metrics.jsonl and TensorBoard files, rewound to where this run continues.
  std::string archived;
  const TrainCounters& c = trainer_->state().counters;
  TensorBoardOptions tb;
  tb.dir = comm_->rank() == 0 ? cfg_.tensorboard_dir : std::string();
  tb.timers = cfg_.log_timers_to_tensorboard;
  tb.batch_size = cfg_.log_batch_size_to_tensorboard;
  tb.validation_ppl = cfg_.log_validation_ppl_to_tensorboard;
  Status st = RunMetrics::Open(env_, shared_dir, tb, &metrics_);
  if (st.ok())
    st = metrics_->Rewind({c.iteration, c.consumed_samples, c.consumed_tokens},
                          rollback ? "rollback"
                          : saved  ? "resume"
                                   : "restart",
                          &archived);
  if (!st.ok()) {
    // Metrics must never stop a run: this process trains without them and says so.
    Warn(
        "metrics: {}; this process trains without metrics.jsonl and TensorBoard files (they are "
        "left as they were)",
        st.message());
    KEEL_RETURN_IF_ERROR(RunMetrics::Open(env_, "", &metrics_));
  } else if (!archived.empty()) {
    Log("metrics: the records after iteration {} were moved to {}; metrics.jsonl and "
        "tensorboard/ continue from iteration {}",
        c.iteration, archived, c.iteration);
  }
  if (!metrics_->tensorboard_dir().empty() && !cfg_.tensorboard_dir.empty())
    Log("tensorboard: event files go to {} (--tensorboard-dir)", metrics_->tensorboard_dir());
  journal_->set_observer([this](const nlohmann::json& ev, const std::string& sentence) {
    const bool has_it = ev.contains("iteration") && ev["iteration"].is_number_integer();
    (void)metrics_->AppendText(
        has_it ? ev["iteration"].get<int64_t>() : trainer_->state().counters.iteration,
        "guard/events", sentence);
  });

  guard_ = std::make_unique<GuardController>(cfg_, env_, store_.get(), trainer_.get(),
                                             store_ ? ckpt_.get() : nullptr, journal_.get(), LogTo);
  KEEL_RETURN_IF_ERROR(guard_->Start(saved));
  ckpt_->set_guard_state_fn([this] { return guard_->StateForCheckpoint(); });
  health_->Attach(trainer_.get(), journal_.get(), metrics_.get());
  ckpt_->set_before_save([this] { return health_->CheckReplicas("before a save"); });
  std::vector<std::pair<int64_t, int64_t>> ranges;
  (void)ParseIterationRanges(cfg_.skip_train_iteration_range, &ranges);  // validated
  for (auto [a, b] : ranges) {
    if (b <= start_iteration) continue;
    journal_->Append(
        {{"event", "skip_range"},
         {"source", "--skip-train-iteration-range"},
         {"iterations", {a, b}},
         {"iteration", start_iteration}},
        fmt::format("iterations {}..{} will be skipped (--skip-train-iteration-range): "
                    "their samples are read past without an update",
                    a, b));
  }
  const TrainState& s = trainer_->state();
  if (cfg_.lr_scale_on_resume > 0 && cfg_.lr_scale_on_resume != s.lr_scale) {
    Log("LR scale {} -> {} (--lr-scale-on-resume){}", s.lr_scale, cfg_.lr_scale_on_resume,
        saved ? "" : "; no checkpoint to resume, so it applies from the first iteration");
    nlohmann::json ev = {{"event", "lr_scale"},
                         {"iteration", start_iteration},
                         {"at", UtcTimestamp()},
                         {"old", s.lr_scale},
                         {"new", cfg_.lr_scale_on_resume}};
    ckpt_->AddHistory(ev);
    journal_->Append(ev, fmt::format("iteration {}: LR scale {} -> {} (--lr-scale-on-resume)",
                                     start_iteration, s.lr_scale, cfg_.lr_scale_on_resume));
    TrainState scaled = s;
    scaled.lr_scale = cfg_.lr_scale_on_resume;
    trainer_->Restore(scaled);
  }
  return Status::OK();
}

Status TrainingRun::Train(Outcome* outcome) {
  if (not_started_) {
    *outcome = Outcome::kNotStarted;
    return Status::OK();
  }
  const TrainCounters& c = trainer_->state().counters;
  start_iteration_ = c.iteration;
  *outcome = Outcome::kFinished;
  if (c.iteration >= trainer_->TotalIterations()) {
    Log("the checkpoint at iteration {} already completes this run of {} iterations; raise "
        "--train-iters (and accept the longer decay with --override-scheduler) to train further",
        c.iteration, trainer_->TotalIterations());
    *outcome = Outcome::kAlreadyComplete;
  } else {
    const auto t0 = std::chrono::steady_clock::now();
    RunHooks hooks;
    hooks.log = LogTo;
    hooks.after_iteration = [this] {
      if (!guard_->AfterIteration()) return false;
      fatal_ = health_->AfterIteration();
      return fatal_.ok() && ckpt_->AfterIteration();
    };
    hooks.step = [this](const StepResult& r) {
      health_->OnStep(r);
      // A loss scale driven down to its floor is how an fp16 run's trouble shows (tr8-104B).
      if (r.loss_scale_change == LossScaleChange::kBackedOff &&
          r.loss_scale <= cfg_.min_loss_scale) {
        const int64_t it = trainer_->state().counters.iteration;
        journal_->Append({{"event", "loss_scale_collapse"},
                          {"iteration", it},
                          {"at", UtcTimestamp()},
                          {"loss_scale", r.loss_scale}},
                         fmt::format("iteration {}: WARNING: the fp16 loss scale fell to its "
                                     "minimum {:g} (--min-loss-scale): gradients overflow even "
                                     "unscaled; the run is likely diverging",
                                     it, r.loss_scale),
                         "guard: ");
      }
    };
    bool metrics_failed = false;
    hooks.metrics = [&](const nlohmann::json& m) {
      Status ms = metrics_->Append(m);
      if (!ms.ok() && !metrics_failed) {  // metrics must never stop training; said once
        // Named by where they go: with --tensorboard-dir and no --save, cfg_.save is empty.
        const std::string where =
            !cfg_.save.empty() && !metrics_->tensorboard_dir().empty() &&
                    metrics_->tensorboard_dir() != JoinPath(cfg_.save, kTensorBoardDir)
                ? fmt::format("{} and {}", cfg_.save, metrics_->tensorboard_dir())
            : !cfg_.save.empty() ? cfg_.save
                                 : metrics_->tensorboard_dir();
        Warn("metrics: cannot write to {}: {}; training goes on without them", where, ms.message());
        metrics_failed = true;
      }
    };
    Status st;
    try {
      st = trainer_->Run(hooks);
    } catch (const KeelError& e) {
      if (!data_error_) throw;
      return StopOnDataError(e.status());
    } catch (const std::bad_alloc&) {
      return OutOfMemory(fmt::format("training (iteration {})", c.iteration + 1));
    }
    // The loop stops with an error only when an update left non-finite weights: that state is
    // never saved, so the newest checkpoint is where the run can go on from.
    if (!st.ok())
      return Status::Corruption(
          fmt::format("{}; {}. {} with a smaller --lr", st.message(), LastCheckpointText(),
                      store_ ? "Resume from it (or from an older one with --load " +
                                   JoinPath(cfg_.save, "iter_N") + ")"
                             : std::string("Train again")));
    if (!fatal_.ok()) return fatal_;  // the replicas differ: nothing of this state is saved
    if (guard_->stopped()) {
      // The state is not healthy: no final checkpoint of it; the pinned ones remain.
      LogError("error: " + guard_->stop_message());
      LogError(fmt::format(
          "the run's chronicle is in {}",
          cfg_.save.empty() ? std::string("the log above") : JoinPath(cfg_.save, kChronicleFile)));
      Log("state fingerprint: {:016x}", trainer_->StateFingerprint());
      *outcome = Outcome::kGuardStopped;
      return Status::OK();
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    KEEL_RETURN_IF_ERROR(ckpt_->Finish());
    if (ckpt_->stop_reason() != StopReason::kNone) {
      Log("stopped at iteration {} of {} because {}{}", c.iteration, trainer_->TotalIterations(),
          StopReasonText(ckpt_->stop_reason()),
          store_ ? "; run the same command to resume" : " (no --save: nothing was saved)");
      Log("state fingerprint: {:016x}", trainer_->StateFingerprint());
      *outcome = Outcome::kStopped;
      return Status::OK();
    }
    Log("training finished: iteration {} in {:.1f} s", c.iteration, secs);
    LogDataParallelTraffic(secs);
    const SamplePrefetcher::Stats ps = prefetcher_->stats();
    if (cfg_.num_workers == 0)
      Log("data: {} samples read on the loop's thread (--num-workers 0)", ps.served);
    else
      Log("data: {} samples read ahead on {}; the loop waited for {} of them ({:.1f} ms in all, "
          "{} read-ahead restarts)",
          ps.served,
          cfg_.num_workers == 1 ? std::string("a background thread")
                                : fmt::format("{} background threads", cfg_.num_workers),
          ps.waited, ps.wait_ms, ps.restarts);
  }
  Log("state fingerprint: {:016x}", trainer_->StateFingerprint());
  health_->Stop();  // the loop is over: the sample below is rank 0's alone
  if (store_)
    Log("checkpoints are in {} (sample with `keel sample --load {}`)", cfg_.save, cfg_.save);
  try {
    return PrintSample();
  } catch (const std::bad_alloc&) {
    return OutOfMemory("sampling text after training (--sample-tokens)");
  }
}

void TrainingRun::LogDataParallelTraffic(double train_seconds) {
  const int world = comm_->world_size();
  if (world == 1) return;
  const ReductionStats& rs = trainer_->reduction_stats();
  const int64_t iters = trainer_->state().counters.iteration - start_iteration_;
  if (iters <= 0 || rs.buckets == 0) return;
  const size_t n = trainer_->model().num_params();
  // This rank sends the part of each bucket it does not own (reduce-scatter), then its shard to
  // every other rank (all-gather of the weights, or of the gradients without ZeRO-1).
  const double rs_bytes = static_cast<double>(rs.bytes_sent);
  const double ag_bytes = static_cast<double>(ShardOf(n, comm_->rank(), world).size()) * 4.0 *
                          (world - 1) * static_cast<double>(iters);
  const double bound = 2.0 * (world - 1) / world * static_cast<double>(n) * 4.0;
  const double per_iter = (rs_bytes + ag_bytes) / static_cast<double>(iters);
  Log("data parallel: this rank sent {:.2f} MB per iteration ({:.2f} reduce-scatter + {:.2f} "
      "all-gather; the 2(N-1)/N x gradient-bytes lower bound is {:.2f} MB); gradient reduction "
      "{:.3f} s in {} buckets, of which {:.3f} s not hidden behind backward ({:.0f}% overlapped); "
      "{:.1f}% of the training time waited on it",
      per_iter / 1e6, rs_bytes / static_cast<double>(iters) / 1e6,
      ag_bytes / static_cast<double>(iters) / 1e6, bound / 1e6, rs.comm_seconds, rs.buckets,
      rs.wait_seconds,
      rs.comm_seconds > 0 ? 100.0 * std::max(0.0, 1.0 - rs.wait_seconds / rs.comm_seconds) : 0.0,
      100.0 * rs.wait_seconds / std::max(train_seconds, 1e-9));
}

Status TrainingRun::StopOnDataError(const Status& error) {
  // The bad sample stopped its iteration before the update: the weights and the TrainState are
  // those of the last completed iteration, so that much progress is kept.
  const int64_t it = trainer_->state().counters.iteration;
  if (comm_->world_size() > 1)  // the other ranks wait in a collective: no save is possible
    return Status::InvalidArgument(fmt::format("{}. Rank {} stops every rank of the job; {}",
                                               error.message(), comm_->rank(),
                                               LastCheckpointText()));
  const char* resume = ": the same command resumes from it once the data is fixed";
  std::string kept;
  if (!store_) {
    kept = "No --save: nothing was saved";
  } else if (it == 0) {
    kept = "No iteration completed: nothing to save";
  } else if (ckpt_->last_saved_iteration() == it) {
    kept = fmt::format("Iteration {}, the last completed, is saved in {}{}", it, cfg_.save, resume);
  } else if (Status st = ckpt_->SaveNow("bad data"); st.ok()) {
    kept =
        fmt::format("Iteration {}, the last completed, was saved in {}{}", it, cfg_.save, resume);
  } else {
    kept =
        fmt::format("Saving iteration {} failed: {}; {}", it, st.message(), LastCheckpointText());
  }
  Log("state fingerprint: {:016x}", trainer_->StateFingerprint());
  return Status::InvalidArgument(error.message() + ". " + kept);
}

std::string TrainingRun::LastCheckpointText() {
  int64_t marker = -1;
  if (!store_) return "no --save was given, so there is no checkpoint";
  if (!store_->ReadMarker(&marker).ok())
    return fmt::format("{} holds no checkpoint of this run", cfg_.save);
  return fmt::format("the last checkpoint is {} (iteration {}; `keel ckpt list {}` lists all)",
                     JoinPath(cfg_.save, CheckpointDirName(marker)), marker, cfg_.save);
}

Status TrainingRun::PrintSample() {
  if (cfg_.sample_tokens <= 0 || comm_->rank() != 0) return Status::OK();
  std::unique_ptr<Tokenizer> tok;
  KEEL_RETURN_IF_ERROR(LoadTokenizerForDataset(prefix_, meta_, &tok));
  std::vector<int32_t> prompt = tok->Encode(cfg_.sample_prompt);
  if (prompt.empty()) prompt.push_back(tok->EodId());
  GenerateOptions go;
  go.max_new_tokens = cfg_.sample_tokens;
  go.seed = cfg_.seed;
  go.window = cfg_.seq_length;
  std::vector<int32_t> out = Generate(trainer_->model(), prompt, go);
  prompt.insert(prompt.end(), out.begin(), out.end());  // decoded together: see sample_cmd.cc
  Log("sample (temperature {}, top-k {}):\n{}", go.temperature, go.top_k, tok->Decode(prompt));
  return Status::OK();
}

}  // namespace keel

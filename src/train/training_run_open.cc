// TrainingRun::Open: assembling a run and the point it continues from (training_run.h).
#include <fmt/format.h>

#include <chrono>

#include "backend/registry.h"
#include "checkpoint/manifest.h"
#include "checkpoint/tensor_pieces.h"
#include "config/parallel_layout.h"
#include "core/json_reader.h"
#include "core/log.h"
#include "core/stop_signal.h"
#include "core/timestamp.h"
#include "journal/events.h"
#include "model/flops.h"
#include "train/memory_estimate.h"
#include "train/rank_agreement.h"
#include "train/training_run.h"

namespace keel {

TrainingRun::TrainingRun(const TrainConfig& config, const RunOptions& options)
    : cfg_(config),
      env_(options.env),
      health_(std::make_unique<RunHealth>(options.env, options.comm, options.test_hooks)),
      comm_(health_->comm()),
      test_hooks_(options.test_hooks),
      process_start_us_(options.env->NowUnixMicros()) {}

TrainingRun::~TrainingRun() {
  // However the run ends short of a crash, the time since the last record is journaled.
  if (goodput_) goodput_->Record("end", trainer_->state().counters.iteration);
  // The log's copy to SAVE/logs/rank-NNN.log writes to rank_log_, which goes with this run; the
  // caller may still log (the error that ended the run).
  if (rank_log_) SetLogCopy(nullptr, /*mute_stdout=*/comm_->rank() != 0, RankPrefix());
}

Status TrainingRun::Open(const TrainConfig& config, const RunOptions& options,
                         std::unique_ptr<TrainingRun>* out) {
  std::string doing = "opening the run";
  try {
    return OpenSteps(config, options, out, &doing);
  } catch (const std::bad_alloc&) {
    return OutOfMemoryError(doing);
  }
}

Status TrainingRun::OpenSteps(const TrainConfig& config, const RunOptions& options,
                              std::unique_ptr<TrainingRun>* out, std::string* doing) {
  KEEL_CHECK(options.env != nullptr && options.comm != nullptr, "a run needs an Env and a comm");
  std::unique_ptr<TrainingRun> run(new TrainingRun(config, options));
  TrainingRun& r = *run;
  // Defaults that depend on the data-parallel size and the vocabulary (global batch, padded
  // vocab) are derived once both are known, from the config as the user gave it. Tensor
  // parallel T: the data-parallel size is world / T (a world that T does not divide is refused
  // by CheckLayout, before any work).
  const int world = r.comm_->world_size(), tensor = r.cfg_.tensor_model_parallel_size;
  const int pipeline = r.cfg_.pipeline_model_parallel_size;
  const bool divides = tensor >= 1 && pipeline >= 1 && world % (tensor * pipeline) == 0;
  r.cfg_.data_parallel_size = divides ? world / (tensor * pipeline) : world;
  // The ranks run one job (the same settings, one directory, no other job in it), and the run
  // directory is checked before any work, so a long run never fails at its end.
  KEEL_RETURN_IF_ERROR(AgreeOnConfig(r.comm_, r.cfg_));
  // The groups of the layout (every rank agreed on T and P just now): tensor ranks adjacent,
  // then data, then pipeline.
  if (divides && (tensor > 1 || pipeline > 1)) {
    KEEL_RETURN_IF_ERROR(ProcessMesh::Make(r.comm_, tensor, pipeline, &r.mesh_));
    // Each group's collectives in a flight recorder of its own (hang dumps name the group).
    if (tensor > 1) r.health_->AddGroup("tensor", r.mesh_->tensor());
    if (pipeline > 1) r.health_->AddGroup("pipeline", r.mesh_->pipeline());
    r.health_->AddGroup("data", r.mesh_->data());
  }
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
  KEEL_RETURN_IF_ERROR(OpenRunData(r.env_, &r.cfg_, &r.data_, &notes));
  if (!divides) KEEL_RETURN_IF_ERROR(r.CheckLayout(&notes));  // names the world and T
  KEEL_RETURN_IF_ERROR(Validate(&r.cfg_, &notes));
  KEEL_RETURN_IF_ERROR(r.CheckLayout(&notes));
  KEEL_RETURN_IF_ERROR(r.health_->Start(r.cfg_));
  const Status fits = r.CheckMemory(&notes);
  for (const std::string& n : notes) Log("note: {}", n);
  KEEL_RETURN_IF_ERROR(fits);
  LogRunData(r.cfg_, *r.data_.data);

  KEEL_RETURN_IF_ERROR(r.ResolveResumeOnEveryRank());
  for (const std::string& n : r.resume_.notes) Log("note: {}", n);
  if (r.resume_.adopted_padded_vocab > 0)
    r.cfg_.model.padded_vocab = r.resume_.adopted_padded_vocab;
  if (r.resume_.kind == ResumePoint::Kind::kFinetune) {
    // A new run from another's weights: its history (an import's provenance) and where it began.
    const SavedTrainState& saved = *r.resume_.saved;
    r.history_ = saved.history;
    FinetuneEvent ev;
    ev.at = UtcTimestamp();
    ev.from = saved.dir;
    ev.from_iteration = saved.train.counters.iteration;
    ev.keel_version = KEEL_VERSION;
    r.history_.push_back(nlohmann::json(ev.ToJson()));
  } else if (r.resume_.saved) {
    const SavedTrainState& saved = *r.resume_.saved;
    const bool rollback = r.resume_.kind == ResumePoint::Kind::kRollback;
    r.history_ = saved.history;
    ResumeEvent ev;
    ev.rollback = rollback;
    ev.iteration = saved.train.counters.iteration;
    ev.at = UtcTimestamp();
    ev.from = saved.dir;
    ev.keel_version = KEEL_VERSION;
    for (const ConfigChange& c : r.resume_.accepted) {
      Log("accepted change on resume: {}: {} -> {} ({})", c.key, c.old_value, c.new_value,
          c.kind == ConfigChange::Kind::kScheduler ? "--override-scheduler"
                                                   : "--override-data-order");
      if (!ev.accepted_changes) ev.accepted_changes.emplace();
      ev.accepted_changes->push_back({c.key, c.old_value, c.new_value});
    }
    // Free changes (a precision, the log interval, ...) need no flag but go into the chronicle.
    for (const ConfigChange& c : r.resume_.free_changes) {
      if (!ev.free_changes) ev.free_changes.emplace();
      ev.free_changes->push_back(DescribeChange(c));
    }
    r.history_.push_back(nlohmann::json(ev.ToJson()));
  }

  Log("resolved config:\n{}", FormatConfig(r.cfg_));
  *doing = "building the model and the optimizer";
  KEEL_RETURN_IF_ERROR(MakeBackend(r.cfg_.backend, r.cfg_.threads, &r.backend_));
  // A config that needs an op the backend lacks stops here, naming both, not mid-iteration.
  KEEL_RETURN_IF_ERROR(CheckBackendSupports(*r.backend_, r.cfg_.model, r.cfg_.precision,
                                            r.cfg_.tensor_model_parallel_size));
  r.backend_->SetPrecision(r.cfg_.precision);  // the trainer sets it too; the log says it now
  Log("backend: {}", r.backend_->Describe());
  auto samples = std::make_shared<RunSamples>(r.cfg_, r.data_, r.test_hooks_);
  r.samples_ = samples.get();
  TrainerGroups groups{r.comm_, r.comm_, nullptr};
  if (r.mesh_) groups = {r.comm_, r.mesh_->data(), r.mesh_->tensor(), r.mesh_->pipeline()};
  r.trainer_ =
      std::make_unique<Trainer>(r.cfg_, r.backend_.get(), groups, samples->Describe(samples));
  r.LogSkippedSampleRanges();
  if (r.test_hooks_ != nullptr) {
    r.faults_ = r.test_hooks_->TrainerFaultsFor(r.comm_->rank(), r.backend_.get(), r.env_);
    r.trainer_->set_faults(r.faults_.get());
  }
  r.LogModel();
  *doing = r.resume_.saved ? "loading the checkpoint" : "initializing the weights";
  KEEL_RETURN_IF_ERROR(r.StartFromResumePoint());
  *doing = "opening the journal, the metrics and the guard";
  KEEL_RETURN_IF_ERROR(r.OpenJournalMetricsAndGuard());
  *out = std::move(run);
  return Status::OK();
}

void TrainingRun::LogModel() {
  const GptSpec& spec = trainer_->model().spec();
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
  const int64_t whole = static_cast<int64_t>(GptModel::ParamCount(spec));
  if (GptModel::IsGpt2Shape(spec)) {
    Log("parameters: {} (formula n*(12h^2+13h) + v*h + s*h + 2h = {}{})", whole, formula,
        whole == formula ? ", equal" : ": differs because of the FFN size");
  } else {
    Log("parameters: {} (from the model's layout; GPT-2's formula n*(12h^2+13h) + v*h + s*h + 2h "
        "= {} does not describe this shape)",
        whole, formula);
  }
  if (mesh_ && mesh_->shape().pipeline > 1)
    Log("pipeline parallel: {} stages{}, {} schedule; this rank ({}) holds {}",
        mesh_->shape().pipeline,
        cfg_.pp_partition_method.empty()
            ? std::string()
            : fmt::format(" (--pp-partition-method {})", cfg_.pp_partition_method),
        trainer_->model().num_chunks() > 1
            ? fmt::format("interleaved ({} chunks per stage)", trainer_->model().num_chunks())
            : std::string("1F1B"),
        mesh_->coords().ToString(), trainer_->DescribeStage());
  if (mesh_)
    Log("model parallel: tensor {} x pipeline {}{}; this rank ({}) holds {} of the {} parameters "
        "(its slices and stage, and the replicated norms and biases)",
        mesh_->shape().tensor, mesh_->shape().pipeline,
        cfg_.sequence_parallel && mesh_->shape().tensor > 1 ? " with sequence parallelism" : "",
        mesh_->coords().ToString(), trainer_->model().num_params(), whole);
  if (comm_->world_size() > 1) {
    const AdamW& opt = trainer_->optimizer();
    // ZeRO-1 shards over the data-parallel ranks: with one (a T x P layout alone) it is on but has
    // nothing to shard, which is not the replicated optimizer of --use-distributed-optimizer=false.
    const std::string mode =
        trainer_->sharded_optimizer() ? "ZeRO-1 (--use-distributed-optimizer)"
        : cfg_.use_distributed_optimizer
            ? "ZeRO-1 on (--use-distributed-optimizer) but one data-parallel rank, so nothing "
              "to shard"
            : "replicated (--use-distributed-optimizer=false)";
    Log("optimizer: {}: this rank holds the Adam moments of {} of {} parameters ({})", mode,
        opt.shard().size(), opt.num_params(), FormatBytes(2 * opt.shard().size() * sizeof(float)));
  }
  Log("training: {} iterations, {} flops per token", trainer_->TotalIterations(),
      fmt::format("{:.3g}", TrainingFlopsPerToken(spec, cfg_.seq_length)));
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
             /*mute_stdout=*/rank != 0, RankPrefix());
  Log("data parallel: {}{}", comm_->Describe(),
      cfg_.save.empty()
          ? ""
          : fmt::format("; this rank logs to {}/logs/rank-{:03d}.log", cfg_.save, rank));
  if (mesh_)
    Log("layout: tensor parallel {} x pipeline parallel {} x data parallel {}; this rank is {}",
        mesh_->shape().tensor, mesh_->shape().pipeline, mesh_->shape().data,
        mesh_->coords().ToString());
  return Status::OK();
}

std::string TrainingRun::RankPrefix() const {
  if (!mesh_) return fmt::format("[rank {}] ", comm_->rank());
  return fmt::format("[rank {} ({})] ", comm_->rank(), mesh_->coords().ToString());
}

Status TrainingRun::CheckLayout(std::vector<std::string>* notes) {
  const int world = comm_->world_size(), tensor = cfg_.tensor_model_parallel_size;
  const int pipeline = cfg_.pipeline_model_parallel_size;
  if (tensor == 1 && cfg_.sequence_parallel)
    notes->push_back(
        "--sequence-parallel with tensor-parallel size 1: there is nothing to split (Megatron-LM "
        "turns it off at size 1 too)");
  if (pipeline == 1 && !cfg_.pp_partition_method.empty())
    notes->push_back(fmt::format(
        "--pp-partition-method {} with one pipeline stage: it holds every layer, so there is "
        "nothing to partition",
        cfg_.pp_partition_method));
  if (tensor == 1 && pipeline == 1 && cfg_.num_layers_per_virtual_pipeline_stage == 0)
    return Status::OK();
  // The rules keel plan prices layouts by (one function: the two never disagree). Its notes
  // repeat the padding Validate noted already; the pipeline's are new.
  ParallelLayout layout;
  std::vector<std::string> layout_notes;
  KEEL_RETURN_IF_ERROR(CheckParallelLayout(
      cfg_, world, fmt::format("the {} MPI rank{}", world, world == 1 ? "" : "s"), tensor, pipeline,
      cfg_.num_layers_per_virtual_pipeline_stage, &layout, &layout_notes));
  if (tensor > 1) KEEL_RETURN_IF_ERROR(GptModel::CheckTensorParallel(cfg_.model, tensor));
  if (pipeline == 1) return Status::OK();
  for (const std::string& n : layout_notes)
    if (n.find("vocab") == std::string::npos) notes->push_back(n);
  std::vector<StageLayers> parts;
  Status st = PartitionStages(cfg_.pp_partition_method, PartitionModelOf(cfg_.model), pipeline,
                              layout.virtual_stages, &parts);
  if (!st.ok()) return Status::InvalidArgument(st.message());
  notes->push_back(fmt::format("pipeline stages: {}", DescribePartition(parts, pipeline)));
  if (layout.virtual_stages > 1 && !cfg_.rampup_batch_size.empty())
    return Status::InvalidArgument(
        "--rampup-batch-size with the interleaved pipeline schedule: the micro-batches per data "
        "rank must stay a multiple of the pipeline size at every step of the ramp (Megatron-LM's "
        "rule), which keel does not check per step yet; drop --rampup-batch-size or "
        "--num-layers-per-virtual-pipeline-stage");
  return Status::OK();
}

Status TrainingRun::ResolveResumeOnEveryRank() {
  // Rank 0 first: it may tidy the run directory (remove an interrupted save, move a corrupt
  // checkpoint aside, adopt an uncommitted one); the others then read the tidied directory.
  Status st;
  if (comm_->rank() == 0) st = ResolveResumePoint(env_, cfg_, LogLine, &resume_);
  st = comm_->AgreeOnStatus(st);
  if (st.ok() && comm_->rank() != 0) st = ResolveResumePoint(env_, cfg_, LogLine, &resume_);
  KEEL_RETURN_IF_ERROR(comm_->AgreeOnStatus(st));
  if (comm_->world_size() > 1) {
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
  }
  KEEL_RETURN_IF_ERROR(ResolveLocalTier());
  return NoteDataParallelChange();
}

Status TrainingRun::ResolveLocalTier() {
  if (cfg_.non_persistent_save_interval <= 0) return Status::OK();
  KEEL_RETURN_IF_ERROR(LocalCheckpointTier::Open(env_, comm_, cfg_, LogLine, &local_tier_));
  Log("note: local checkpoints every {} iterations (--non-persistent-save-interval) to {}, the "
      "newest {} kept; persistent ones to {} as before",
      cfg_.non_persistent_save_interval, local_tier_->Describe(), LocalCheckpointTier::kKeep,
      cfg_.save);
  const int64_t persistent = resume_.saved ? resume_.saved->train.counters.iteration : -1;
  using Kind = ResumePoint::Kind;
  if (resume_.kind != Kind::kFresh && resume_.kind != Kind::kResume) {
    // --load of another run or checkpoint: the local pieces of --save's own run do not apply (a
    // rollback to SAVE/iter_N discards the newer ones when it runs).
    if (resume_.kind != Kind::kRollback) local_tier_->DiscardNewerThan(-1);
    return Status::OK();
  }
  std::string dir;
  std::vector<std::string> notes;
  KEEL_RETURN_IF_ERROR(local_tier_->FindResume(persistent, &dir, &notes));
  for (const std::string& n : notes) Log("note: {}", n);
  if (dir.empty()) return Status::OK();
  ResumePoint local;
  Status st = comm_->AgreeOnStatus(ResolveLocalResumePoint(env_, cfg_, dir, &local));
  KEEL_RETURN_IF_ERROR(st);
  resume_ = std::move(local);
  return Status::OK();
}

Status TrainingRun::NoteDataParallelChange() {
  if (resume_.continues_run()) {
    JsonReader reader(JoinPath(resume_.saved->dir, "state.json"), resume_.saved->state);
    const int saved_dp = reader.root()["optimizer"]
                             .Optional("data_parallel_size")
                             .Get<int>(1);  // older checkpoints: one process
    const int saved_tp = reader.root()["optimizer"].Optional("tensor_parallel_size").Get<int>(1);
    const int saved_pp = reader.root()["optimizer"].Optional("pipeline_parallel_size").Get<int>(1);
    KEEL_RETURN_IF_ERROR(reader.status());
    const int tensor = cfg_.tensor_model_parallel_size;
    const int pipeline = cfg_.pipeline_model_parallel_size;
    if (saved_tp != 1 || tensor != 1 || saved_pp != 1 || pipeline != 1) {
      // A model-parallel layout on either side: the pieces' note says what is re-cut.
      if (saved_tp == tensor && saved_pp == pipeline && saved_dp == cfg_.data_parallel_size)
        return Status::OK();
      CheckpointTensors ckpt;
      CheckpointTensors::Options o;
      o.checksums = false;  // only the headers are read here; the load checks what it reads
      KEEL_RETURN_IF_ERROR(CheckpointTensors::Open(env_, resume_.saved->dir, o, &ckpt));
      PieceCoords now;
      now.tensor = tensor;
      now.pipeline = pipeline;
      now.data = cfg_.data_parallel_size;
      if (mesh_)
        now.tp = mesh_->coords().tp, now.pp = mesh_->coords().pp, now.dp = mesh_->coords().dp;
      const std::string note = ReshardNote(ckpt, now);
      if (!note.empty()) Log("{}", note);
      return Status::OK();
    }
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
    store_ = std::make_unique<CheckpointStore>(env_, cfg_.save, LogLine);
    store_->set_read_only(comm_->rank() != 0);  // rank 0 owns the run directory's shared files
  }
  RunInfo run_info{data_.prefix, data_.meta, nlohmann::json::array()};
  for (int d = 0; d < data_.data->NumDatasets(); ++d)
    run_info.datasets.push_back({{"name", data_.data->source(d).name},
                                 {"prefix", data_.data->source(d).prefix},
                                 {"shards", data_.data->source(d).shards},
                                 {"weight", data_.data->source(d).weight}});
  ckpt_ = std::make_unique<CheckpointController>(cfg_, env_, store_.get(), trainer_.get(), run_info,
                                                 history_, LogLine);
  if (local_tier_) ckpt_->set_local_tier(std::move(local_tier_));
  // Test-only rank faults may write a weight anywhere in an iteration (corrupt=, bitflip=):
  // their runs snapshot at once.
  if (test_hooks_ != nullptr && !test_hooks_->rank_faults.empty()) ckpt_->set_defer_snapshot(false);
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
      // A local checkpoint is not in --save: the next persistent save is still due.
      KEEL_RETURN_IF_ERROR(ckpt_->Restore(saved, resume_.in_save_dir() && !resume_.local_tier));
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
    Log("resumed from {}{}: iteration {}, consumed samples {}, optimizer step {}, next LR "
        "{:.6E}, LR scale {} (loaded in {:.2f} s)",
        saved.dir, resume_.local_tier ? " (local tier)" : "", s.counters.iteration,
        s.counters.consumed_samples, s.optimizer_step, trainer_->NextLr(), s.lr_scale, ls);
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
  journal_ = std::make_unique<RunJournal>(env_, shared_dir, LogLine);
  goodput_ = std::make_unique<GoodputClock>(env_, journal_.get(), process_start_us_);
  journal_->Heading(fmt::format("{} at iteration {} ({}, keel {})",
                                saved ? (rollback ? "rolled back" : "resumed") : "started",
                                start_iteration, UtcTimestamp(), KEEL_VERSION));
  if (saved) {
    std::string changes;
    for (const ConfigChange& c : resume_.free_changes)
      changes += (changes.empty() ? "; changed: " : ", ") + DescribeChange(c);
    journal_->Append(history_.back(),
                     fmt::format("{} from {} at iteration {}{}",
                                 rollback             ? "rolled back by hand"
                                 : resume_.local_tier ? "resumed (local tier)"
                                                      : "resumed",
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

  guard_ =
      std::make_unique<GuardController>(cfg_, env_, store_.get(), trainer_.get(),
                                        store_ ? ckpt_.get() : nullptr, journal_.get(), LogLine);
  KEEL_RETURN_IF_ERROR(guard_->Start(saved));
  health_->Attach(trainer_.get(), journal_.get(), metrics_.get());
  reporter_ = std::make_unique<RunReporter>(cfg_, trainer_->data(), trainer_->TotalIterations(),
                                            metrics_.get(), journal_.get());
  std::vector<std::pair<int64_t, int64_t>> ranges;
  (void)ParseIterationRanges(cfg_.skip_train_iteration_range, &ranges);  // validated
  for (auto [a, b] : ranges) {
    if (b <= start_iteration) continue;
    SkipRangeEvent ev;
    ev.source = "--skip-train-iteration-range";
    ev.iterations = {a, b};
    ev.iteration = start_iteration;
    journal_->Append(
        ev, fmt::format("iterations {}..{} will be skipped (--skip-train-iteration-range): "
                        "their samples are read past without an update",
                        a, b));
  }
  const TrainState& s = trainer_->state();
  if (cfg_.lr_scale_on_resume > 0 && cfg_.lr_scale_on_resume != s.lr_scale) {
    Log("LR scale {} -> {} (--lr-scale-on-resume){}", s.lr_scale, cfg_.lr_scale_on_resume,
        saved ? "" : "; no checkpoint to resume, so it applies from the first iteration");
    LrScaleEvent ev;
    ev.iteration = start_iteration;
    ev.at = UtcTimestamp();
    ev.old_scale = s.lr_scale;
    ev.new_scale = cfg_.lr_scale_on_resume;
    ckpt_->AddHistory(nlohmann::json(ev.ToJson()));
    journal_->Append(ev, fmt::format("iteration {}: LR scale {} -> {} (--lr-scale-on-resume)",
                                     start_iteration, s.lr_scale, cfg_.lr_scale_on_resume));
    TrainState scaled = s;
    scaled.lr_scale = cfg_.lr_scale_on_resume;
    trainer_->Restore(scaled);
  }
  return Status::OK();
}

}  // namespace keel

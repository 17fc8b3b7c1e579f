#include "train/run_health.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>

#include "comm/process_mesh.h"
#include "core/exit_code.h"
#include "core/host_name.h"
#include "core/log.h"
#include "core/timestamp.h"
#include "journal/events.h"
#include "train/replica_check.h"

namespace keel {
namespace {

constexpr int64_t kStragglerWarmup = 20;  // iterations of a process the straggler detector skips

uint64_t MinutesToMicros(double minutes) {
  return static_cast<uint64_t>(minutes * 60e6);
}

}  // namespace

RunHealth::RunHealth(Env* env, Communicator* base, const TestHooks* hooks)
    : env_(env), hooks_(hooks), phases_(env), comm_(base, env) {}

RunHealth::~RunHealth() {
  Stop();
}

std::string RunHealth::RankText(int rank) const {
  return fmt::format("rank {} (host {})", rank,
                     rank < static_cast<int>(hosts_.size()) ? hosts_[rank] : "?");
}

void RunHealth::AddGroup(const std::string& name, Communicator* group) {
  auto* g = dynamic_cast<RecordingCommunicator*>(group);
  if (g == nullptr) return;  // not split from comm()
  g->set_group_name(name);
  g->set_check_every(cfg_.debug_collectives);
  groups_.push_back(g);
}

Status RunHealth::Start(const TrainConfig& cfg) {
  cfg_ = cfg;
  const int rank = comm_.rank(), world = comm_.world_size();
  comm_.set_check_every(cfg.debug_collectives);
  for (RecordingCommunicator* g : groups_) g->set_check_every(cfg.debug_collectives);
  // Rank 0's pid and clock name the job: a trigger file of an earlier job is never mistaken for
  // this one's.
  std::vector<std::string> all;
  comm_.AllGatherBytes(fmt::format("{}-{}", getpid(), env_->NowUnixMicros()), &all);
  job_id_ = all[0];
  comm_.AllGatherBytes(ThisHostName(), &hosts_);
  if (cfg.distributed_timeout_minutes > 0) {
    WatchdogOptions o;
    o.hangs_dir = cfg.save.empty() ? std::string() : JoinPath(cfg.save, "hangs");
    o.job_id = job_id_;
    o.rank = rank;
    o.world_size = world;
    o.host = hosts_[rank];
    // Tensor or pipeline parallel: the dump names the rank's mesh coordinates (Megatron's rank
    // order).
    const int tensor = cfg.tensor_model_parallel_size;
    const int pipeline = cfg.pipeline_model_parallel_size;
    if ((tensor > 1 || pipeline > 1) && tensor >= 1 && pipeline >= 1 &&
        world % (tensor * pipeline) == 0)
      o.mesh = CoordsOf(MeshShape{tensor, pipeline, world / (tensor * pipeline)}, rank).ToString();
    o.timeout_us = MinutesToMicros(cfg.distributed_timeout_minutes);
    o.first_iteration_timeout_us = MinutesToMicros(cfg.first_iteration_timeout_minutes);
    o.save_timeout_us = MinutesToMicros(cfg.save_timeout_minutes);
    o.eval_timeout_us = MinutesToMicros(cfg.eval_timeout_minutes);
    // Rank 0 journals the hang (from the watchdog's thread: the main thread is the one stuck).
    if (rank == 0)
      o.on_dump = [this](const std::string& line, const std::string& dir) {
        if (RunJournal* j = journal_.load()) {
          HangEvent ev;
          const PhaseSnapshot snap = phases_.Snapshot();
          ev.iteration = snap.iteration;
          // Where the hang began, for goodput (the phase stood still since then).
          const uint64_t now = env_->NowMicros();
          ev.unix_time = static_cast<double>(env_->NowUnixMicros()) / 1e6;
          ev.stuck_seconds =
              now > snap.since_us ? static_cast<double>(now - snap.since_us) / 1e6 : 0;
          ev.dir = dir;
          ev.exit_code = ToInt(ExitCode::kRanksCannotGoOn);
          j->Append(ev, line, "");
        }
      };
    watchdog_ = std::make_unique<Watchdog>(env_, &phases_, &comm_.recorder(), o);
    for (RecordingCommunicator* g : groups_) {
      watchdog_->AddGroup(g->group_name(), &g->recorder());
      // The pipeline's sends and receives too: a stage stuck in one is named by them.
      if (g->group_name() == "pipeline")
        watchdog_->AddGroup(kPipelineTransfersGroup, &g->p2p_recorder());
    }
    watchdog_->Start();
    Log("watchdog: a phase longer than {:g} min ({:g} min for startup and the first iteration, "
        "{:g} for a save, {:g} for an evaluation) is a hang: every rank dumps its stacks to {} "
        "and the job exits 4",
        cfg.distributed_timeout_minutes, cfg.first_iteration_timeout_minutes,
        cfg.save_timeout_minutes, cfg.eval_timeout_minutes,
        o.hangs_dir.empty() ? std::string("stderr (no --save)") : o.hangs_dir + "/iter_N/");
  } else {
    Log("watchdog: off (--distributed-timeout-minutes 0): a hang would wait for ever");
  }
  if (world > 1) {
    if (cfg.straggler_window > 0) {
      StragglerOptions so;
      so.window = static_cast<int>(cfg.straggler_window);
      so.threshold = cfg.straggler_threshold;
      // Pipeline stages do different work (the last computes the loss): a rank is compared with
      // the ranks of its own stage only (its data and tensor peers).
      const int tensor = std::max(1, cfg.tensor_model_parallel_size);
      const int pipeline = std::max(1, cfg.pipeline_model_parallel_size);
      std::vector<int> stage_of(static_cast<size_t>(world), 0);
      if (pipeline > 1 && world % (tensor * pipeline) == 0) {
        const MeshShape shape{tensor, pipeline, world / (tensor * pipeline)};
        for (int r = 0; r < world; ++r) stage_of[static_cast<size_t>(r)] = CoordsOf(shape, r).pp;
      }
      stragglers_ = std::make_unique<StragglerDetector>(world, so, stage_of);
      // Every stage has T x D ranks: with one, no rank has a peer to be slower than.
      if (!stragglers_->lone_groups().empty())
        Log("note: stragglers: each of the {} pipeline stages has one rank, and a rank is "
            "compared only with the ranks of its own stage (stages do different work): no rank "
            "can be named a straggler in this layout",
            pipeline);
    }
    Log("checks: collectives in step {}; replicas {}; stragglers {}",
        cfg.debug_collectives ? "before every collective (--debug-collectives)"
                              : "at every host collective",
        cfg.check_replicas_interval > 0
            ? fmt::format("every {} iterations and at every save", cfg.check_replicas_interval)
            : std::string("at every save"),
        stragglers_ ? fmt::format("{:g}% slower for {} iterations{}", 100 * cfg.straggler_threshold,
                                  5 * cfg.straggler_window,
                                  cfg.pipeline_model_parallel_size > 1
                                      ? " than the other ranks of the same pipeline stage"
                                      : "")
                    : std::string("off"));
  }
  drops_ = std::make_unique<ThroughputDropDetector>(world, ThroughputDropOptions{});
  const ThroughputDropOptions& t = drops_->options();
  Log("checks: throughput: samples per second {:g}% or more below the best level the run "
      "sustained (the {:g}th percentile of its {}-iteration windows' medians) for {} iterations is "
      "a drop, and so is a sustained {:g}% or more below its median level before, once the median "
      "of {} to {} iterations is that far under it by {:g} standard errors of the noise the run "
      "shows; journaled with its recovery; the baseline is set anew after {} iterations of "
      "warm-up at the start, at each batch ramp-up stage and after a rollback",
      100 * t.threshold, 100 * t.percentile, t.window, t.window, 100 * t.shift.min_shift,
      t.shift.min_window, t.shift.max_window, t.shift.z, t.warmup);
  return Status::OK();
}

void RunHealth::Attach(Trainer* trainer, RunJournal* journal, RunMetrics* metrics) {
  trainer_ = trainer;
  journal_.store(journal);
  metrics_ = metrics;
  trainer_->set_phase_tracker(&phases_);
  auto out_of_step = [this](const std::string& report) {
    CollectivesOutOfStepEvent ev;
    ev.iteration = phases_.Snapshot().iteration;
    ev.exit_code = ToInt(ExitCode::kRanksCannotGoOn);
    Journal(ev, report);
  };
  comm_.set_on_out_of_step(out_of_step);
  for (RecordingCommunicator* g : groups_) g->set_on_out_of_step(out_of_step);
  if (hooks_ == nullptr) return;
  comm_.set_skip_fault(
      hooks_->SkipCollectiveFault(comm_.rank(), [this] { return phases_.Snapshot().iteration; }));
  for (RecordingCommunicator* g : groups_)
    if (g->group_name() == "pipeline")
      g->set_p2p_fault(
          hooks_->PointToPointFault(comm_.rank(), [this] { return phases_.Snapshot().iteration; }));
}

void RunHealth::Journal(const JournalEvent& event, const std::string& sentence) {
  if (RunJournal* j = journal_.load())
    j->Append(event, sentence, "health: ");
  else
    Log("{}", sentence);
}

void RunHealth::OnStep(const StepResult& r) {
  const int64_t it = trainer_->state().counters.iteration;
  WatchThroughput(r, it);
  // The first iteration of a process warms caches and threads: not a rank's pace.
  if (++steps_seen_ == 1 || r.data_skipped) return;
  // The first iterations of a process fault in pages and fill caches and pools, unevenly across
  // ranks (measured: 10-20% apart under a sanitizer): not a rank's pace.
  if (stragglers_ && steps_seen_ > kStragglerWarmup) {
    std::vector<double> secs(r.rank_compute_ms.size());
    for (size_t k = 0; k < secs.size(); ++k) secs[k] = r.rank_compute_ms[k] * 1e-3;
    for (const StragglerEvent& e : stragglers_->Add(it, secs)) {
      SlowRankEvent ev;
      ev.recovered = !e.named;
      ev.iteration = it;
      ev.rank = e.rank;
      ev.host = hosts_[e.rank];
      ev.slowdown = e.slowdown;
      ev.since_iteration = e.since_iteration;
      Journal(ev, e.named
                      ? fmt::format(
                            "iteration {}: {} is a straggler: its compute time per "
                            "iteration has been {:.1f}% above the other ranks'{} since "
                            "iteration {}; the whole job runs at its pace",
                            it, RankText(e.rank), 100 * e.slowdown,
                            cfg_.pipeline_model_parallel_size > 1 ? " of its pipeline stage" : "",
                            e.since_iteration)
                      : fmt::format("iteration {}: {} is no longer a straggler ({:+.1f}%)", it,
                                    RankText(e.rank), 100 * e.slowdown));
    }
    const std::vector<double>& s = stragglers_->last_slowdowns();
    if (metrics_ && !s.empty() && it % cfg_.straggler_window == 0) {
      size_t worst = 0;
      for (size_t k = 1; k < s.size(); ++k)
        if (s[k] > s[worst]) worst = k;
      (void)metrics_->AppendScalar(it, "stragglers/max_slowdown", s[worst]);
      (void)metrics_->AppendScalar(it, "stragglers/slowest_rank", static_cast<double>(worst));
    }
  }
}

void RunHealth::OnSave(double seconds) {
  saves_.push_back({last_iteration_, seconds});
  while (saves_.size() > 100) saves_.pop_front();
}

void RunHealth::WatchThroughput(const StepResult& r, int64_t it) {
  // What the time since the previous iteration went to: the CPU share tells another process on
  // the cores (or a wait) from the process's own work; the data wait, a starving loader.
  IterationCost cost;
  const uint64_t now_us = env_->NowMicros();
  const double cpu = env_->ProcessCpuSeconds();
  if (last_step_us_ > 0) {
    cost.wall = static_cast<double>(now_us - last_step_us_) * 1e-6;
    cost.cpu = cpu - last_cpu_seconds_;
  }
  cost.data_wait = phases_.IterationSeconds(Phase::kData);
  last_step_us_ = now_us;
  last_cpu_seconds_ = cpu;
  if (!drops_) return;  // not started
  // A batch ramp-up stage changes an iteration's work, and a rollback (the iteration went back)
  // restarts the pace: neither is a drop. A resume is a new process: a new detector.
  if (r.global_batch != last_global_batch_ || it <= last_iteration_) {
    drops_->Rebaseline();
    anchor_iteration_ = it;
    costs_.clear();
  }
  last_global_batch_ = r.global_batch;
  last_iteration_ = it;
  if (r.data_skipped) return;  // nothing computed: no throughput (a gap in the log too)
  costs_.push_back({it, cost});
  while (costs_.size() > 200) costs_.pop_front();
  const double secs = r.step_ms * 1e-3;
  std::vector<double> compute(r.rank_compute_ms.size());
  for (size_t k = 0; k < compute.size(); ++k) compute[k] = r.rank_compute_ms[k] * 1e-3;
  // Samples per second: what the iteration line reports, so `keel logs analyze` of this run's log
  // reads the same series.
  const auto d = drops_->Add(it, static_cast<double>(r.global_batch) / secs, secs, compute);
  const int window = drops_->options().window;
  if (metrics_ && it % window == 0 && std::isfinite(drops_->baseline())) {
    (void)metrics_->AppendScalar(it, "throughput/baseline_samples_per_second", drops_->baseline());
    (void)metrics_->AppendScalar(it, "throughput/slowdown", drops_->last_drop());
  }
  if (!d) return;
  JobSlowdownEvent ev;
  ev.recovered = !d->dropped;
  ev.iteration = it;
  ev.since_iteration = d->since_iteration;
  ev.drop = d->drop;
  ev.baseline = d->baseline;
  ev.level = d->level;
  ev.window = d->window;
  if (std::isfinite(d->z)) ev.z = d->z, ev.noise = d->noise;
  // How sure: the drop over its standard error, against the noise the run's iterations show.
  const std::string sure =
      std::isfinite(d->z)
          ? fmt::format("z = {:.1f} over the median of {} iterations, noise {:.2f}% an iteration",
                        d->z, d->window, 100 * d->noise)
          : std::string("z not measured: too few iterations before it");
  const bool many = comm_.world_size() > 1;
  if (many) {
    ev.follows_rank = d->follows_rank;
    if (d->follows_rank >= 0) ev.host = hosts_[static_cast<size_t>(d->follows_rank)];
  }
  if (!d->dropped) {
    Journal(ev, fmt::format("iteration {}: throughput recovered since iteration {}: {:.4g} samples "
                            "per second against {:.4g} ({:+.1f}% time per iteration; {})",
                            it, d->since_iteration, d->level, d->baseline, 100 * d->drop, sure));
    return;
  }
  std::string cause = ThroughputCause(d->since_iteration);
  if (!cause.empty()) ev.reason = cause;
  if (many)
    cause += (cause.empty() ? "" : "; ") +
             (d->follows_rank >= 0
                  ? fmt::format("it follows {}, whose own compute time rose {:.1f}%",
                                RankText(d->follows_rank), 100 * d->rank_rise)
                  : std::string("no single rank explains it: every rank slowed (the filesystem, "
                                "the network or the machines)"));
  if (cause.empty()) cause = "no cause visible in the process's CPU time, data wait or saves";
  Journal(ev, fmt::format("iteration {}: the job slowed: an iteration takes {:.1f}% longer since "
                          "iteration {}: {:.4g} samples per second against {:.4g}, {} since "
                          "iteration {} ({}); {}",
                          it, 100 * d->drop, d->since_iteration, d->level, d->baseline,
                          d->sustained ? "its median level before (a sustained shift)"
                                       : "the best level it sustained",
                          anchor_iteration_, sure, cause));
}

std::string RunHealth::ThroughputCause(int64_t since) const {
  const size_t w = static_cast<size_t>(drops_->options().window);
  std::vector<IterationCost> before, now;
  for (const Cost& c : costs_)
    if (c.iteration < since) before.push_back(c.cost);
  if (before.size() > w) before.erase(before.begin(), before.end() - static_cast<long>(w));
  for (size_t k = costs_.size() > w ? costs_.size() - w : 0; k < costs_.size(); ++k)
    now.push_back(costs_[k].cost);
  int64_t saves = 0;
  double save_seconds = 0;
  for (const SaveTime& s : saves_) {
    if (s.after_iteration < since - 1) continue;
    ++saves;
    save_seconds += s.seconds;
  }
  auto median = [](const std::vector<IterationCost>& v) {
    IterationCost m;
    if (v.size() < 3) return m;  // too few to say
    std::vector<double> wall, cpu, data;
    for (const IterationCost& c : v) {
      if (std::isfinite(c.wall)) wall.push_back(c.wall);
      if (std::isfinite(c.cpu)) cpu.push_back(c.cpu);
      if (std::isfinite(c.data_wait)) data.push_back(c.data_wait);
    }
    m.wall = MedianOf(std::move(wall));
    m.cpu = MedianOf(std::move(cpu));
    m.data_wait = MedianOf(std::move(data));
    return m;
  };
  return DropCause(median(before), median(now), saves, save_seconds);
}

Status RunHealth::AfterIteration() {
  const int64_t it = trainer_->state().counters.iteration;
  const int rank = comm_.rank();
  if (hooks_ && hooks_->BitFlipAt(rank, it)) {
    GptModel& model = trainer_->model();
    const ParamInfo& p = model.params()[model.params().size() / 2];
    const size_t at = p.offset + p.numel / 2;
    float v = 0;
    model.backend()->CopyToHost(&v, model.param_data() + at, 1);
    uint32_t bits = 0;
    std::memcpy(&bits, &v, 4);
    bits ^= 1u;  // the lowest mantissa bit: a silent change, training goes on
    std::memcpy(&v, &bits, 4);
    model.backend()->CopyToDevice(model.mutable_param_data() + at, &v, 1);
    LogError(fmt::format("fault: rank {} flipped one bit of {} (element {}) after iteration {}",
                         rank, p.name, p.numel / 2, it));
  }
  if (comm_.world_size() > 1 && cfg_.check_replicas_interval > 0 &&
      it % cfg_.check_replicas_interval == 0)
    return CheckReplicas(fmt::format("--check-replicas-interval {}", cfg_.check_replicas_interval));
  return Status::OK();
}

Status RunHealth::CheckReplicas(const std::string& why) {
  if (comm_.world_size() == 1) return Status::OK();
  PhaseScope check(&phases_, Phase::kCheck);
  const uint64_t t0 = env_->NowMicros();
  size_t checked = 0;
  Status st = keel::CheckReplicas(*trainer_, &comm_, hosts_, &checked);
  const int64_t it = trainer_->state().counters.iteration;
  if (!st.ok()) {
    ReplicaMismatchEvent ev;
    ev.iteration = it;
    ev.message = st.message();
    Journal(ev, st.message());
    return Status::Corruption(
        st.message() +
        ". The run stops without saving this state; the newest checkpoint was checked when it "
        "was written: resume from it (the same command; keel launch does it by itself)");
  }
  if (first_replica_check_)
    Log("replica check at iteration {} ({}): {} tensors identical on {} ranks ({:.1f} ms)", it, why,
        checked, comm_.world_size(), static_cast<double>(env_->NowMicros() - t0) / 1e3);
  first_replica_check_ = false;
  return Status::OK();
}

void RunHealth::Stop() {
  watchdog_.reset();
}

}  // namespace keel

#include "watchdog/watchdog.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>

#include "core/host_name.h"
#include "core/log.h"
#include "watchdog/hang_dump.h"
#include "watchdog/stack_trace.h"

namespace keel {
namespace {

constexpr uint64_t kSecond = 1'000'000;

std::string IterDirName(int64_t iteration) {
  return fmt::format("iter_{}", iteration);
}

// "in collective #S KIND" (the oldest still in flight: the one the others wait in), or "in the
// tensor group's collective #S KIND" when a group's is, else "after collective #S KIND", else
// "before any collective". A pipeline send or receive in flight is no collective (only the peer
// stage takes part): "in send-to-P, the pipeline group's transfer #S", and `transfer` is set.
std::string CollectivePhrase(const HangDump& d, bool* transfer) {
  *transfer = false;
  const std::vector<DumpedCollective>& cs = d.collectives;
  for (const DumpedCollective& c : cs)
    if (c.in_flight) return fmt::format("in collective #{} {}", c.seq, c.kind);
  for (const GroupCollectives& g : d.groups)
    for (const DumpedCollective& c : g.collectives) {
      if (!c.in_flight) continue;
      if (g.name != kPipelineTransfersGroup)
        return fmt::format("in the {} group's collective #{} {}", g.name, c.seq, c.kind);
      *transfer = true;
      return fmt::format("in {}, the pipeline group's transfer #{}", c.kind, c.seq);
    }
  if (cs.empty()) return "before any collective";
  return fmt::format("after collective #{} {}", cs.back().seq, cs.back().kind);
}

// Reads "iter_N rank R" from a trigger file.
bool ParseTrigger(const std::string& text, std::string* dir_name, int* rank) {
  char dir[64] = {};
  int r = -1;
  long long iter = -1;
  if (std::sscanf(text.c_str(), "iter_%lld rank %d", &iter, &r) != 2 || iter < 0 || r < 0)
    return false;
  std::snprintf(dir, sizeof(dir), "iter_%lld", iter);
  *dir_name = dir;
  *rank = r;
  return true;
}

}  // namespace

std::string HangTriggerPath(const std::string& hangs_dir, const std::string& job_id) {
  std::string name = ".trigger-" + job_id;
  std::replace(name.begin(), name.end(), '/', '_');  // one file in hangs_dir, whatever the id
  return JoinPath(hangs_dir, name);
}

Watchdog::Watchdog(Env* env, const PhaseTracker* phases, const CollectiveRecorder* collectives,
                   WatchdogOptions o)
    : env_(env), phases_(phases), collectives_(collectives), o_(std::move(o)) {
  if (o_.host.empty()) o_.host = ThisHostName();
  if (o_.poll_us == 0) {
    uint64_t smallest = 0;
    for (uint64_t t :
         {o_.timeout_us, o_.first_iteration_timeout_us, o_.save_timeout_us, o_.eval_timeout_us})
      if (t > 0 && (smallest == 0 || t < smallest)) smallest = t;
    o_.poll_us = smallest == 0 ? kSecond : std::clamp<uint64_t>(smallest / 10, 1000, kSecond);
  }
  if (o_.join_grace_us == 0)
    o_.join_grace_us = std::min(30 * kSecond, std::max(5 * kSecond, o_.timeout_us / 2));
  if (!o_.exit) {
    o_.exit = [](int code) {
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(code);
    };
  }
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::Start() {
  if (thread_.joinable()) return;
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      lock.unlock();
      const bool fired = CheckOnce();
      lock.lock();
      if (fired) break;
      cv_.wait_for(lock, std::chrono::microseconds(o_.poll_us), [this] { return stop_; });
    }
  });
}

uint64_t Watchdog::LimitFor(const PhaseSnapshot& s) const {
  uint64_t own = 0;
  if (s.phase == Phase::kSave) {
    own = o_.save_timeout_us;
  } else if (s.phase == Phase::kEval) {
    own = o_.eval_timeout_us;
  } else if (s.first_iteration) {
    own = o_.first_iteration_timeout_us;
  }
  return own > 0 ? own : o_.timeout_us;
}

void Watchdog::Pause(uint64_t us) {
  // Short steps so a destructor in the middle of a wait does not wait out the grace period.
  while (us > 0) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
    }
    const uint64_t step = std::min<uint64_t>(us, 50'000);
    env_->SleepForMicros(step);
    us -= step;
  }
}

bool Watchdog::CheckOnce() {
  std::lock_guard<std::mutex> lock(check_mu_);
  if (fired_) return false;
  const PhaseSnapshot s = phases_->Snapshot();
  const uint64_t now = env_->NowMicros();

  if (!o_.hangs_dir.empty()) {
    const std::string trigger = HangTriggerPath(o_.hangs_dir, o_.job_id);
    if (env_->FileExists(trigger)) {
      Firing f;
      f.here = false;
      std::string text;
      if (!env_->ReadFileToString(trigger, &text).ok() ||
          !ParseTrigger(text, &f.dir_name, &f.trigger_rank)) {
        f.dir_name = IterDirName(s.iteration);  // unreadable: dump beside this iteration's
      }
      return Fire(s, f);
    }
  }

  Firing f;
  f.limit_us = LimitFor(s);
  const uint64_t in_phase = now > s.since_us ? now - s.since_us : 0;
  if (f.limit_us == 0 || in_phase <= f.limit_us) return false;
  f.dir_name = IterDirName(s.iteration);
  return Fire(s, f);
}

Status Watchdog::ClaimTrigger(std::string* dir_name) {
  const std::string trigger = HangTriggerPath(o_.hangs_dir, o_.job_id);
  const std::string mine = trigger + fmt::format(".rank-{}", o_.rank);
  const std::string content = fmt::format("{} rank {}\n", *dir_name, o_.rank);
  KEEL_RETURN_IF_ERROR(WriteFileAtomic(env_, mine, content));
  // link(2) creates the trigger only if no rank did: ranks whose limits pass together (all of
  // them, in a collective that never ends) then agree on one directory.
  const Status linked = env_->LinkFile(mine, trigger);
  env_->RemoveFile(mine);
  if (linked.ok()) return Status::OK();
  std::string text, other_dir;
  int other_rank = -1;
  if (env_->ReadFileToString(trigger, &text).ok() && ParseTrigger(text, &other_dir, &other_rank)) {
    *dir_name = other_dir;
    return Status::OK();
  }
  return WriteFileAtomic(env_, trigger, content);  // a filesystem without hard links
}

bool Watchdog::Fire(const PhaseSnapshot& s, Firing f) {
  HangDump d;
  d.rank = o_.rank;
  d.world_size = o_.world_size;
  d.host = o_.host;
  d.mesh = o_.mesh;
  d.pid = getpid();
  d.fired_here = f.here;
  d.phase = PhaseName(s.phase);
  d.iteration = s.iteration;
  d.threads = CaptureAllThreadStacks();
  const uint64_t now = env_->NowMicros();
  // A long phase that ended while the stacks were taken was no hang.
  if (f.here && phases_->Snapshot().generation != s.generation) return false;
  fired_ = true;
  const uint64_t in_phase = now > s.since_us ? now - s.since_us : 0;
  d.phase_seconds = static_cast<double>(in_phase) / kSecond;
  d.unix_time = env_->NowUnixMicros() / static_cast<int64_t>(kSecond);
  if (collectives_ != nullptr) {
    d.digest = collectives_->digest();
    d.collectives = DumpCollectives(collectives_->Recent(), now);
  }
  for (const auto& [name, recorder] : groups_) {
    GroupCollectives g;
    g.name = name;
    g.digest = recorder->digest();
    g.collectives = DumpCollectives(recorder->Recent(), now);
    d.groups.push_back(std::move(g));
  }
  // The main thread inside a pipeline send or receive is in a transfer, which the phase tracker
  // files under "reduce" (the per-iteration collectives): the line names the transfer.
  bool transfer = false;
  const std::string collective = CollectivePhrase(d, &transfer);
  const std::string where =
      fmt::format("{} of iteration {} for {:.1f} s",
                  transfer ? std::string("pipeline transfer (send/recv)") : d.phase, d.iteration,
                  d.phase_seconds);
  if (f.here) {
    d.reason = fmt::format("the main thread has been in {}, over its limit of {:g} s", where,
                           static_cast<double>(f.limit_us) / kSecond);
  } else {
    d.reason = fmt::format("{} watchdog fired ({}); this rank dumped where it was",
                           f.trigger_rank >= 0 ? fmt::format("rank {}'s", f.trigger_rank)
                                               : std::string("another rank's"),
                           f.dir_name);
  }

  std::string iter_dir, dump_path;
  Status st = Status::NotFound("no hangs directory");
  if (!o_.hangs_dir.empty()) {
    st = env_->CreateDirs(o_.hangs_dir);
    if (st.ok() && f.here) st = ClaimTrigger(&f.dir_name);
    iter_dir = JoinPath(o_.hangs_dir, f.dir_name);
    dump_path = JoinPath(iter_dir, HangDumpFileName(o_.rank));
    if (st.ok()) st = env_->CreateDirs(iter_dir);
    if (st.ok()) st = WriteFileAtomic(env_, dump_path, FormatHangDump(d));
    if (!st.ok())
      LogError(fmt::format("error: watchdog: cannot write the hang dump {}: {}", dump_path,
                           st.message()));
  }
  if (!st.ok()) LogError(FormatHangDump(d));

  const std::string lead =
      f.here ? "has been in"
             : fmt::format("joins the hang dump of {}: it has been in",
                           f.trigger_rank >= 0 ? fmt::format("rank {}", f.trigger_rank)
                                               : std::string("another rank"));
  const std::string limit =
      f.here ? fmt::format("limit {:g} s; ", static_cast<double>(f.limit_us) / kSecond) : "";
  const std::string stacks = st.ok() ? fmt::format("stacks in {}", dump_path) : "stacks above";
  const std::string analyze =
      st.ok() ? fmt::format(" (`keel hangs analyze {}` groups the ranks)", iter_dir) : "";
  const std::string line =
      fmt::format("watchdog: rank {} (host {}{}) {} {} ({}{}); {}; ending the job with exit {}{}",
                  o_.rank, o_.host, o_.mesh.empty() ? "" : "; " + o_.mesh, lead, where, limit,
                  collective, stacks, o_.exit_code, analyze);
  LogError("error: " + line);
  if (o_.on_dump) o_.on_dump(line, st.ok() ? iter_dir : std::string());

  // The other ranks dump when they see the trigger: give them until the grace period ends.
  if (st.ok() && o_.world_size > 1) {
    const uint64_t start = env_->NowMicros();
    for (;;) {
      std::vector<std::string> names;
      std::set<int> ranks;
      if (env_->GetChildren(iter_dir, &names).ok())
        for (const std::string& n : names)
          if (int r = RankOfHangDumpFile(n); r >= 0) ranks.insert(r);
      if (static_cast<int>(ranks.size()) >= o_.world_size) break;
      if (env_->NowMicros() - start >= o_.join_grace_us) break;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_) break;
      }
      Pause(std::min<uint64_t>(o_.poll_us, 100'000));
    }
  }
  o_.exit(o_.exit_code);
  return true;
}

}  // namespace keel

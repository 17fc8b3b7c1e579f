#include "train/test_hooks.h"

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <memory>
#include <thread>

#include "backend/backend.h"
#include "config/config.h"
#include "core/host_name.h"
#include "core/log.h"
#include "core/rng.h"
#include "train/trainer.h"

namespace keel {
namespace {

Status BadFaults(const std::string& text, const std::string& why) {
  return Status::InvalidArgument(
      "KEEL_TRAIN_FAULTS=" + text + ": " + why +
      "; expected comma-separated poison=A-B, nan-grad=A-B, overflow=A-B (iteration ranges), "
      "lr=A-B*X (X times the LR over a range), save-delay=S (seconds), "
      "hang=N, kill=N, hang-send=N, hang-recv=N, "
      "bitflip=N, skip-collective=N, corrupt=N (iterations), slow=F (a fraction), each optionally "
      "followed "
      "by :rank=R, :host=H, :attempt=A, (skip-collective) :kind=K and (slow) :iters=A-B");
}

bool ParseInt(const std::string& s, int64_t* v) {
  char* end = nullptr;
  *v = std::strtoll(s.c_str(), &end, 10);
  return !s.empty() && end != nullptr && *end == '\0' && *v >= 0;
}

// One item of KEEL_TRAIN_FAULTS: KEY=VALUE[:rank=R][:attempt=A][:kind=K].
Status ParseFaultItem(const std::string& text, const std::string& item, const std::string& attempt,
                      TestHooks* out) {
  std::vector<std::string> parts;
  for (size_t p = 0; p <= item.size();) {
    const size_t colon = std::min(item.find(':', p), item.size());
    parts.push_back(item.substr(p, colon - p));
    p = colon + 1;
  }
  const size_t eq = parts[0].find('=');
  if (eq == std::string::npos) return BadFaults(text, "'" + item + "' has no =");
  const std::string key = parts[0].substr(0, eq), value = parts[0].substr(eq + 1);
  if (key == "poison" || key == "nan-grad" || key == "overflow") {
    std::vector<std::pair<int64_t, int64_t>> r;
    if (parts.size() != 1 || !ParseIterationRanges({value}, &r).ok())
      return BadFaults(text, "'" + item + "' is not an iteration range");
    auto& list = key == "poison" ? out->poison : key == "nan-grad" ? out->nan_grad : out->overflow;
    list.push_back({r[0].first, r[0].second});
    return Status::OK();
  }
  if (key == "lr") {
    const size_t star = value.find('*');
    std::vector<std::pair<int64_t, int64_t>> r;
    char* end = nullptr;
    const double x = star == std::string::npos ? 0 : std::strtod(value.c_str() + star + 1, &end);
    if (parts.size() != 1 || star == std::string::npos || star + 1 == value.size() ||
        *end != '\0' || !(x > 0 && x < 1e6) ||
        !ParseIterationRanges({value.substr(0, star)}, &r).ok())
      return BadFaults(text, "'" + item + "' is not lr=A-B*X with a positive factor X");
    out->lr.push_back({{r[0].first, r[0].second}, x});
    return Status::OK();
  }
  if (key == "save-delay") {
    char* end = nullptr;
    const double d = std::strtod(value.c_str(), &end);
    if (parts.size() != 1 || value.empty() || *end != '\0' || !(d > 0 && d < 3600))
      return BadFaults(text, "'" + item + "' needs a number of seconds (above 0, below 3600)");
    out->save_delay_seconds = d;
    return Status::OK();
  }
  RankFault f;
  int64_t n = 0;
  if (key == "slow") {
    f.kind = RankFault::Kind::kSlow;
    char* end = nullptr;
    f.fraction = std::strtod(value.c_str(), &end);
    if (value.empty() || *end != '\0' || !(f.fraction > 0 && f.fraction < 100))
      return BadFaults(text, "'" + item + "' needs a positive fraction");
  } else {
    if (key == "hang")
      f.kind = RankFault::Kind::kHang;
    else if (key == "kill")
      f.kind = RankFault::Kind::kKill;
    else if (key == "bitflip")
      f.kind = RankFault::Kind::kBitFlip;
    else if (key == "skip-collective")
      f.kind = RankFault::Kind::kSkipCollective;
    else if (key == "corrupt")
      f.kind = RankFault::Kind::kCorrupt;
    else if (key == "hang-send")
      f.kind = RankFault::Kind::kHangSend;
    else if (key == "hang-recv")
      f.kind = RankFault::Kind::kHangRecv;
    else
      return BadFaults(text, "unknown fault '" + key + "'");
    if (!ParseInt(value, &n) || n < 1)
      return BadFaults(text, "'" + item + "' needs an iteration of at least 1");
    f.iteration = n;
  }
  bool armed = true, has_rank = false, has_host = false;
  for (size_t i = 1; i < parts.size(); ++i) {
    const size_t e = parts[i].find('=');
    const std::string k = parts[i].substr(0, e),
                      v = e == std::string::npos ? "" : parts[i].substr(e + 1);
    if (k == "rank" && ParseInt(v, &n)) {
      f.rank = static_cast<int>(n);
      has_rank = true;
    } else if (k == "host" && !v.empty()) {
      // Armed in the processes on host H only (ThisHostName: KEEL_TEST_HOSTNAME in tests).
      armed = armed && ThisHostName() == v;
      has_host = true;
    } else if (k == "attempt" && ParseInt(v, &n)) {
      armed = attempt == v;
    } else if (k == "kind" && f.kind == RankFault::Kind::kSkipCollective && !v.empty()) {
      f.collective = v;
    } else if (k == "iters" && f.kind == RankFault::Kind::kSlow) {
      std::vector<std::pair<int64_t, int64_t>> r;
      if (!ParseIterationRanges({v}, &r).ok() || r.size() != 1)
        return BadFaults(text, "'" + parts[i] + "' in '" + item + "' is not one iteration range");
      f.iterations = {r[0].first, r[0].second};
    } else {
      return BadFaults(text, "'" + parts[i] + "' in '" + item + "'");
    }
  }
  if (has_host && !has_rank) f.rank = -1;  // whichever rank runs on that host
  if (armed) out->rank_faults.push_back(f);
  return Status::OK();
}

// An Env whose checkpoint commits (the rename of .tmp.iter_N into place) first wait: a save
// that takes seconds without a model that takes minutes to train.
class SaveDelayEnv : public FaultInjectionEnv {
 public:
  SaveDelayEnv(Env* base, double seconds) : FaultInjectionEnv(base), seconds_(seconds) {}
  Status RenameFile(const std::string& from, const std::string& to) override {
    if (from.find(".tmp.iter_") != std::string::npos)
      std::this_thread::sleep_for(std::chrono::duration<double>(seconds_));
    return FaultInjectionEnv::RenameFile(from, to);
  }

 private:
  double seconds_;
};

}  // namespace

Status TestHooks::FromEnvironment(Env* base, TestHooks* out) {
  *out = TestHooks{};
  // First: the host= items below compare against it.
  if (const char* host = std::getenv("KEEL_TEST_HOSTNAME"); host != nullptr && *host) {
    OverrideHostNameForTesting(host);
    Warn("this process plays host {} (KEEL_TEST_HOSTNAME): for testing only", host);
  }
  if (const char* spec = std::getenv("KEEL_FAULT_INJECTION"); spec != nullptr && *spec) {
    KEEL_RETURN_IF_ERROR(FaultInjectionEnv::FromSpec(spec, base, &out->fault_env));
    Warn("fault injection active (KEEL_FAULT_INJECTION={}): for testing only", spec);
  }
  if (const char* spec = std::getenv("KEEL_TRAIN_FAULTS"); spec != nullptr && *spec) {
    const std::string text = spec;
    const char* attempt_env = std::getenv("KEEL_LAUNCH_ATTEMPT");
    const std::string attempt = attempt_env ? attempt_env : "";
    size_t pos = 0;
    while (pos <= text.size()) {
      const size_t comma = std::min(text.find(',', pos), text.size());
      KEEL_RETURN_IF_ERROR(ParseFaultItem(text, text.substr(pos, comma - pos), attempt, out));
      pos = comma + 1;
    }
    Warn("training faults injected (KEEL_TRAIN_FAULTS={}): for testing only", text);
  }
  if (out->save_delay_seconds > 0) {
    if (out->fault_env)
      return Status::InvalidArgument(
          "KEEL_TRAIN_FAULTS save-delay= and KEEL_FAULT_INJECTION cannot be armed together; "
          "arm one of them");
    out->fault_env = std::make_unique<SaveDelayEnv>(base, out->save_delay_seconds);
  }
  return Status::OK();
}

bool TestHooks::Poisoned(int64_t iteration) const {
  for (const IterationRange& r : poison)
    if (r.Contains(iteration)) return true;
  return false;
}

void TestHooks::PoisonSample(uint64_t seed, int64_t index, int seq_length, int vocab,
                             int32_t* tokens) {
  const RngKey key{seed + 77, RngPurpose::kTest, static_cast<uint64_t>(index)};
  for (int t = 0; t <= seq_length; ++t)
    tokens[t] = static_cast<int32_t>(U64At(key, t) % static_cast<uint64_t>(vocab));
}

namespace {

// The trainer's faults of one rank, from the parsed KEEL_TRAIN_FAULTS items.
class RankTrainerFaults : public TrainerFaults {
 public:
  RankTrainerFaults(const TestHooks& h, int rank, Backend* backend, Env* env)
      : rank_(rank), backend_(backend), env_(env), nan_(h.nan_grad), inf_(h.overflow), lr_(h.lr) {
    for (const RankFault& f : h.rank_faults) {
      if (f.rank >= 0 && f.rank != rank) continue;
      if (f.kind == RankFault::Kind::kCorrupt) corrupt_.push_back({f.iteration, false});
      if (f.kind == RankFault::Kind::kHang || f.kind == RankFault::Kind::kKill ||
          f.kind == RankFault::Kind::kSlow)
        compute_.push_back(f);
    }
  }
  bool armed() const {
    return !nan_.empty() || !inf_.empty() || !lr_.empty() || !corrupt_.empty() || !compute_.empty();
  }

  double LrFactor(int64_t it) const override {
    double x = 1;
    for (const TestHooks::LrFactor& f : lr_)
      if (f.range.Contains(it)) x *= f.factor;
    return x;
  }

  bool CorruptWeights(int64_t it) override {
    for (auto& [at, fired] : corrupt_) {
      if (at != it || fired) continue;
      fired = true;  // once: a transient fault leaves no trace in the state
      LogError(
          fmt::format("fault: rank {} computes iteration {} on a corrupted weight", rank_, it));
      return true;
    }
    return false;
  }

  void AfterBackward(int64_t it, double compute_seconds) override {
    for (const RankFault& f : compute_) {
      if (f.kind == RankFault::Kind::kSlow) {
        if (!f.iterations.Contains(it)) continue;
        if (env_)
          env_->SleepForMicros(static_cast<uint64_t>(f.fraction * compute_seconds * 1e6));
        else
          std::this_thread::sleep_for(std::chrono::duration<double>(f.fraction * compute_seconds));
      } else if (f.iteration == it && f.kind == RankFault::Kind::kKill) {
        LogError(fmt::format("fault: rank {} kills itself (SIGKILL) at iteration {}", rank_, it));
        std::raise(SIGKILL);
      } else if (f.iteration == it) {
        LogError(fmt::format("fault: rank {} stops at iteration {} (hangs, no more collectives)",
                             rank_, it));
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
      }
    }
  }

  void OnGradients(int64_t it, float* grads, size_t) override {
    for (const auto* ranges : {&nan_, &inf_}) {
      for (const IterationRange& r : *ranges) {
        if (!r.Contains(it)) continue;
        const float bad = ranges == &nan_ ? NAN : INFINITY;
        backend_->CopyToDevice(grads, &bad, 1);
      }
    }
  }

 private:
  int rank_;
  Backend* backend_;
  Env* env_;  // slow sleeps through it (null: the thread sleeps)
  std::vector<IterationRange> nan_, inf_;
  std::vector<TestHooks::LrFactor> lr_;
  std::vector<std::pair<int64_t, bool>> corrupt_;  // iteration, fired
  std::vector<RankFault> compute_;
};

}  // namespace

std::unique_ptr<TrainerFaults> TestHooks::TrainerFaultsFor(int rank, Backend* backend,
                                                           Env* env) const {
  auto f = std::make_unique<RankTrainerFaults>(*this, rank, backend, env);
  if (!f->armed()) return nullptr;
  return f;
}

bool TestHooks::BitFlipAt(int rank, int64_t iteration) const {
  for (const RankFault& f : rank_faults)
    if (f.kind == RankFault::Kind::kBitFlip && (f.rank < 0 || f.rank == rank) &&
        f.iteration == iteration)
      return true;
  return false;
}

std::function<bool(const std::string&)> TestHooks::SkipCollectiveFault(
    int rank, std::function<int64_t()> iteration) const {
  for (const RankFault& f : rank_faults) {
    if (f.kind != RankFault::Kind::kSkipCollective || (f.rank >= 0 && f.rank != rank)) continue;
    auto done = std::make_shared<bool>(false);
    return [f, rank, iteration, done](const std::string& kind) {
      if (*done || kind != f.collective || iteration() != f.iteration) return false;
      *done = true;
      LogError(fmt::format("fault: rank {} skips {} in iteration {}", rank, kind, f.iteration));
      return true;
    };
  }
  return nullptr;
}

std::function<void(const std::string&)> TestHooks::PointToPointFault(
    int rank, std::function<int64_t()> iteration) const {
  std::vector<RankFault> mine;
  for (const RankFault& f : rank_faults)
    if ((f.kind == RankFault::Kind::kHangSend || f.kind == RankFault::Kind::kHangRecv) &&
        (f.rank < 0 || f.rank == rank))
      mine.push_back(f);
  if (mine.empty()) return nullptr;
  return [mine, rank, iteration](const std::string& kind) {
    for (const RankFault& f : mine) {
      const char* prefix = f.kind == RankFault::Kind::kHangSend ? "send-" : "recv-";
      if (kind.rfind(prefix, 0) != 0 || iteration() != f.iteration) continue;
      LogError(fmt::format("fault: rank {} hangs inside the pipeline {} in iteration {}", rank,
                           kind, f.iteration));
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  };
}

}  // namespace keel

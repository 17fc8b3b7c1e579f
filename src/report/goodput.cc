#include "report/goodput.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <sstream>

#include "journal/events.h"
#include "journal/run_journal.h"
#include "launch/launch_events.h"

namespace keel {

const std::vector<std::pair<std::string, std::string>>& GoodputCategories() {
  static const std::vector<std::pair<std::string, std::string>> k = {
      {"productive", "productive (iterations that stayed in the model)"},
      {"lost", "lost (iterations recomputed after a crash or rollback)"},
      {"save", "save stall"},
      {"eval", "evaluation"},
      {"startup", "start-up and resume"},
      {"data_wait", "waiting for data"},
      {"hang", "hang until the watchdog fired"},
      {"restart", "restart backoff and downtime"},
      {"guard", "guard reruns and probes"},
      {"other", "other"},
  };
  return k;
}

namespace {

size_t IndexOf(const std::string& key) {
  const auto& c = GoodputCategories();
  for (size_t i = 0; i < c.size(); ++i)
    if (c[i].first == key) return i;
  return c.size() - 1;
}

// The walk over the journal: the time of each process and attempt, put in its category as it
// comes; iterations stay productive until a resume or rollback goes back before them.
class Accountant {
 public:
  explicit Accountant(std::map<int64_t, AttemptEndEvent> attempts)
      : attempts_(std::move(attempts)), seconds_(GoodputCategories().size(), 0.0) {}

  void Add(const std::string& key, double s) { seconds_[IndexOf(key)] += s; }

  // keel launch began at `t`: its time before the first attempt is start-up.
  void Launch(double t) {
    if (first_) return;  // a second launch on the same directory continues the job
    first_ = t;
    end_ = t;
    launch_start_ = true;
  }

  void StartProcess(const GoodputStartEvent& e) {
    if (proc_) CloseProcess();
    if (e.attempt > 0) AttemptsWithoutProcess(e.attempt);
    const auto a = e.attempt > 0 ? attempts_.find(e.attempt) : attempts_.end();
    const double begin = a != attempts_.end() ? a->second.start_time : e.process_start;
    Begin(begin);
    Add("startup", std::max(0.0, e.unix_time - begin));
    proc_ = Proc{e.attempt, e.unix_time, false, std::nullopt};
    if (e.attempt > 0) last_attempt_ = e.attempt;
    ++processes_;
    Rewind(e.iteration);  // what the previous processes trained past it is recomputed
  }

  void Record(const GoodputEvent& e) {
    if (!proc_) return;
    const GoodputSeconds& s = e.seconds;
    const double span = std::max(0.0, e.unix_time - proc_->last_time);
    Add("data_wait", s.data_wait);
    Add("eval", s.eval);
    Add("save", s.save);
    Add("guard", s.guard);
    Add("startup", s.resume);
    Add("other", s.other);
    if (e.first_iteration <= e.last_iteration)
      spans_.push_back({e.first_iteration, e.last_iteration, s.compute});
    else
      Add("other", s.compute);
    // The record's span and its parts differ only by the clocks' rounding.
    Add("other", span - (s.compute + s.data_wait + s.eval + s.save + s.guard + s.resume + s.other));
    proc_->last_time = e.unix_time;
    proc_->ended = e.why == "end";
  }

  void Hang(const HangEvent& e) {
    if (proc_ && e.unix_time) proc_->hang_start = *e.unix_time - e.stuck_seconds.value_or(0.0);
  }

  // Iterations after `iteration` computed so far are lost: the run went back to it.
  void Rewind(int64_t iteration) {
    std::vector<Span> kept;
    for (const Span& s : spans_) {
      if (s.last <= iteration) {
        kept.push_back(s);
        continue;
      }
      const double n = static_cast<double>(s.last - s.first + 1);
      const double gone = static_cast<double>(s.last - std::max(iteration, s.first - 1)) / n;
      Add("lost", s.seconds * gone);
      if (gone < 1) kept.push_back({s.first, iteration, s.seconds * (1 - gone)});
    }
    spans_ = std::move(kept);
  }

  void Finish(GoodputBreakdown* out) {
    if (proc_) CloseProcess();
    AttemptsWithoutProcess(-1);
    for (const Span& s : spans_) Add("productive", s.seconds);
    out->wall_seconds = first_ && end_ ? std::max(0.0, *end_ - *first_) : 0.0;
    double sum = 0;
    for (double s : seconds_) sum += s;
    seconds_[IndexOf("other")] += out->wall_seconds - sum;  // what no record covers, exactly
    out->seconds = seconds_;
    out->processes = processes_;
    out->attempts = static_cast<int>(attempts_.size());
  }

 private:
  struct Span {
    int64_t first, last;
    double seconds;
  };
  struct Proc {
    int64_t attempt;
    double last_time;  // the newest record's time
    bool ended;        // its last record is the end of the run: it exited by itself
    std::optional<double> hang_start;
  };

  // A new span of time begins at `t`: the gap since the previous end is the restart's.
  void Begin(double t) {
    if (!first_) first_ = t;
    if (end_) Add(launch_start_ ? "startup" : "restart", std::max(0.0, t - *end_));
    launch_start_ = false;
  }

  // An attempt whose process never began its loop: all of it start-up. Those before `before`
  // (-1: all that remain).
  void AttemptsWithoutProcess(int64_t before) {
    for (const auto& [n, a] : attempts_) {
      if (n <= last_attempt_ || (before >= 0 && n >= before)) continue;
      Begin(a.start_time);
      Add("startup", std::max(0.0, a.end_time - a.start_time));
      end_ = std::max(end_.value_or(a.end_time), a.end_time);
      last_attempt_ = n;
    }
  }

  // The time after a process's last record: the exit of a clean end, else iterations lost to
  // the crash, and a hang from where the watchdog saw the phase stand still.
  void CloseProcess() {
    const Proc p = *proc_;
    proc_.reset();
    const auto a = p.attempt > 0 ? attempts_.find(p.attempt) : attempts_.end();
    const double end =
        a != attempts_.end() ? std::max(a->second.end_time, p.last_time) : p.last_time;
    const double tail = end - p.last_time;
    if (p.hang_start) {
      const double lost = std::clamp(*p.hang_start - p.last_time, 0.0, tail);
      Add("lost", lost);
      Add("hang", tail - lost);
    } else {
      Add(p.ended ? "other" : "lost", tail);
    }
    end_ = end;
  }

  std::map<int64_t, AttemptEndEvent> attempts_;
  std::vector<double> seconds_;
  std::vector<Span> spans_;
  std::optional<Proc> proc_;
  std::optional<double> first_, end_;
  int64_t last_attempt_ = 0;
  int processes_ = 0;
  bool launch_start_ = false;  // the next Begin is launch's first attempt
};

template <class E>
Status Read(const nlohmann::json& line, const std::string& where, E* e) {
  return E::FromJson(line, where, e);
}

}  // namespace

double GoodputBreakdown::Of(const std::string& key) const {
  const size_t i = IndexOf(key);
  return i < seconds.size() ? seconds[i] : 0.0;
}

nlohmann::ordered_json GoodputBreakdown::ToJson() const {
  nlohmann::ordered_json c = nlohmann::ordered_json::object();
  const auto& cats = GoodputCategories();
  for (size_t i = 0; i < cats.size() && i < seconds.size(); ++i) c[cats[i].first] = seconds[i];
  nlohmann::ordered_json j = {{"wall_seconds", wall_seconds}, {"categories", c}};
  if (estimate) {
    j["estimate"] = true;
    j["notes"] = notes;
  }
  return j;
}

Status GoodputFromEvents(const std::vector<nlohmann::json>& lines, const std::string& where,
                         GoodputBreakdown* out) {
  *out = GoodputBreakdown{};
  std::map<int64_t, AttemptEndEvent> attempts;
  bool any = false;
  for (size_t i = 0; i < lines.size(); ++i) {
    const nlohmann::json& l = lines[i];
    if (!l.is_object() || !l.contains(kEventKey)) continue;
    const std::string at = fmt::format("{} line {}", where, i + 1);
    const std::string kind = l[kEventKey].is_string() ? l[kEventKey].get<std::string>() : "";
    if (kind == AttemptEndEvent::kKind) {
      AttemptEndEvent e;
      KEEL_RETURN_IF_ERROR(Read(l, at, &e));
      attempts[e.attempt] = e;
    }
    any = any || kind == GoodputStartEvent::kKind;
  }
  if (!any)
    return Status::NotFound(fmt::format(
        "{} holds no goodput records (goodput_start): the run was trained by a keel older than "
        "goodput, or its loop never began; `keel logs analyze` estimates goodput from a log",
        where));
  Accountant acc(std::move(attempts));
  for (size_t i = 0; i < lines.size(); ++i) {
    const nlohmann::json& l = lines[i];
    if (!l.is_object() || !l.contains(kEventKey) || !l[kEventKey].is_string()) continue;
    const std::string at = fmt::format("{} line {}", where, i + 1);
    const std::string kind = l[kEventKey].get<std::string>();
    if (kind == LaunchEvent::kKind) {
      LaunchEvent e;
      KEEL_RETURN_IF_ERROR(Read(l, at, &e));
      if (e.unix_time) acc.Launch(*e.unix_time);
    } else if (kind == GoodputStartEvent::kKind) {
      GoodputStartEvent e;
      KEEL_RETURN_IF_ERROR(Read(l, at, &e));
      acc.StartProcess(e);
    } else if (kind == GoodputEvent::kKind) {
      GoodputEvent e;
      KEEL_RETURN_IF_ERROR(Read(l, at, &e));
      acc.Record(e);
    } else if (kind == RollbackEvent::kKind) {
      RollbackEvent e;
      KEEL_RETURN_IF_ERROR(Read(l, at, &e));
      acc.Rewind(e.to_iteration);
    } else if (kind == HangEvent::kKind) {
      HangEvent e;
      KEEL_RETURN_IF_ERROR(Read(l, at, &e));
      acc.Hang(e);
    }
  }
  acc.Finish(out);
  return Status::OK();
}

Status ComputeGoodput(Env* env, const std::string& run_dir, GoodputBreakdown* out) {
  const std::string path = JoinPath(run_dir, kEventsFile);
  if (!env->FileExists(path))
    return Status::NotFound(fmt::format(
        "{} not found: goodput reads a run directory of `keel train --save DIR` (or `keel launch "
        "... --save DIR`); for a log of another framework use `keel logs analyze`",
        path));
  std::string text;
  KEEL_RETURN_IF_ERROR(env->ReadFileToString(path, &text));
  std::vector<nlohmann::json> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    // A line cut short by a crash is the only one that may not parse: it is skipped.
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    lines.push_back(j.is_discarded() ? nlohmann::json() : std::move(j));
  }
  return GoodputFromEvents(lines, path, out);
}

std::string FormatGoodputTable(const GoodputBreakdown& g) {
  const auto& cats = GoodputCategories();
  const double w = g.wall_seconds > 0 ? g.wall_seconds : 1.0;
  std::string s = fmt::format(
      "{}goodput: {:.1f}% productive of {:.1f} s wall time ({} process{}{})\n",
      g.estimate ? "estimated " : "", 100.0 * g.Of("productive") / w, g.wall_seconds, g.processes,
      g.processes == 1 ? "" : "es",
      g.attempts > 0 ? fmt::format(", {} keel launch attempts", g.attempts) : std::string());
  s += fmt::format("  {:<56} {:>10} {:>7}\n", "category", "seconds", "share");
  for (size_t i = 0; i < cats.size() && i < g.seconds.size(); ++i)
    s += fmt::format("  {:<56} {:>10.2f} {:>6.1f}%\n", cats[i].second, g.seconds[i],
                     100.0 * g.seconds[i] / w);
  for (const std::string& n : g.notes) s += "  note: " + n + "\n";
  return s;
}

std::string GoodputSentence(const GoodputBreakdown& g) {
  const auto& cats = GoodputCategories();
  const double w = g.wall_seconds > 0 ? g.wall_seconds : 1.0;
  std::vector<std::pair<double, size_t>> rest;
  for (size_t i = 1; i < cats.size() && i < g.seconds.size(); ++i)
    if (g.seconds[i] >= 0.05) rest.push_back({g.seconds[i], i});
  std::sort(rest.rbegin(), rest.rend());
  std::string parts;
  for (const auto& [s, i] : rest)
    parts += fmt::format("{}{} {:.1f} s ({:.1f}%)", parts.empty() ? "" : ", ", cats[i].second, s,
                         100.0 * s / w);
  return fmt::format(
      "goodput: {:.1f}% of the job's {:.1f} s wall time was productive ({:.1f} s){}{}",
      100.0 * g.Of("productive") / w, g.wall_seconds, g.Of("productive"), parts.empty() ? "" : "; ",
      parts);
}

}  // namespace keel

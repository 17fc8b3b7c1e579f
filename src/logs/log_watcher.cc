#include "logs/log_watcher.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/json_number.h"
#include "core/timestamp.h"
#include "guard/robust_window.h"

namespace keel {
namespace {

constexpr int kDefaultDropWindow = 20;

// JSON text of `j`, bytes that are not UTF-8 (a log path with byte 0xff) as U+FFFD: dump()
// would throw and end the watch.
std::string Dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string Parent(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// Why `dir`'s journal is not one this watcher may append to ("" when it may), and how many of
// its entries a watch wrote.
std::string ForeignJournal(Env* env, const std::string& dir, int64_t* watch_entries) {
  *watch_entries = 0;
  std::string text;
  if (env->ReadFileToString(JoinPath(dir, kEventsFile), &text).ok()) {
    std::istringstream lines(text);
    std::string line;
    for (int n = 1; std::getline(lines, line); ++n) {
      if (line.empty()) continue;
      const nlohmann::json e = nlohmann::json::parse(line, nullptr, false);
      if (IsWatchEntry(e)) {
        ++*watch_entries;
        continue;
      }
      JournalLineHeader h;
      const std::string what = JournalLineHeader::FromJson(e, kEventsFile, &h).ok() && h.event
                                   ? fmt::format("\"{}\": \"{}\"", kEventKey, *h.event)
                                   : std::string("not a keel logs watch entry");
      return fmt::format("{}/{} holds another journal (line {}: {}; a keel run's guard journal?)",
                         dir, kEventsFile, n, what);
    }
  }
  if (env->ReadFileToString(JoinPath(dir, kChronicleFile), &text).ok()) {
    std::istringstream lines(text);
    std::string line;
    for (int n = 1; std::getline(lines, line); ++n) {
      if (line.rfind("## ", 0) == 0 && line.rfind("## watching ", 0) != 0)
        return fmt::format("{}/{} holds another chronicle (line {}: \"{}\")", dir, kChronicleFile,
                           n, line);
    }
  }
  return "";
}

}  // namespace

const std::set<std::string>& LogEventKinds() {
  static const std::set<std::string> kinds = {
      "spike", "resume_spike", "spike_recovered", "spike_unresolved", "divergence",
      "nan",   "skipped",      "restart",         "throughput_drop"};
  return kinds;
}

LogWatcher::LogWatcher(Env* env, LogWatchOptions opt, EventCommandRunner* runner, Output out)
    : env_(env),
      opt_(std::move(opt)),
      runner_(runner),
      out_(out ? std::move(out) : Output([](const std::string&) {})),
      follower_(env, opt_.log),
      parser_(&parsed_) {
  if (opt_.analysis.drop_window <= 0) opt_.analysis.drop_window = kDefaultDropWindow;
  scanner_ = std::make_unique<LogEventScanner>(opt_.analysis, opt_.analysis.drop_window,
                                               [this](const LogEventUpdate& u) { OnUpdate(u); });
  parser_.BeginFile(opt_.log);
}

LogWatcher::~LogWatcher() = default;

Status LogWatcher::Open() {
  const std::string& dir = opt_.out_dir;
  if (dir.empty()) return Status::InvalidArgument("no output directory for the journal (--out)");
  // Before anything is written: a FIFO, device, socket or symlink loop as the log is refused now.
  KEEL_RETURN_IF_ERROR(LogFollower::CheckFollowable(env_, opt_.log));
  if (env_->FileExists(dir) && !env_->IsDirectory(dir))
    return Status::InvalidArgument(
        fmt::format("--out {}: not a directory; give a directory for events.jsonl and "
                    "CHRONICLE.md",
                    dir));
  int64_t earlier = 0;
  const std::string foreign = ForeignJournal(env_, dir, &earlier);
  if (!foreign.empty())
    return Status::InvalidArgument(
        foreign +
        ": the watcher would mix its findings into it; give another --out (nothing "
        "in it was touched)");
  if (earlier > 0 && !opt_.append_to_journal)
    return Status::InvalidArgument(fmt::format(
        "{} already holds the journal of an earlier watch ({} entries in {}): pass --from-end to "
        "go on from where the log is now (the lines already there prime the detectors and are "
        "not journaled again), --from-start to journal the whole log again after a new heading, "
        "or give another --out (nothing in it was touched)",
        dir, earlier, kEventsFile));
  if (!opt_.kill_switch.empty()) {
    const std::string parent = Parent(opt_.kill_switch);
    if (!env_->IsDirectory(parent))
      return Status::InvalidArgument(
          fmt::format("--kill-switch {}: the directory {} does not exist; create it, or give the "
                      "path the run was started with (--kill-switch-path)",
                      opt_.kill_switch, parent));
    if (env_->FileExists(opt_.kill_switch))
      out_(fmt::format(
          "WARNING: the kill switch {} exists already: a run started with --kill-switch-path {} "
          "stops (or does not start) while it is there; the watcher leaves it as it is",
          opt_.kill_switch, opt_.kill_switch));
  }
  KEEL_RETURN_IF_ERROR(env_->CreateDirs(dir));
  if (earlier > 0)
    out_(fmt::format(
        "note: {} holds the journal of an earlier watch ({} entries): appending, after a new "
        "heading in {}",
        dir, earlier, kChronicleFile));
  journal_ = std::make_unique<RunJournal>(env_, dir, out_, "watch: ");
  journal_->Heading(fmt::format("watching {} from its {} ({}, keel {})", opt_.log,
                                opt_.from_end ? "end" : "start", UtcTimestamp(), KEEL_VERSION));
  priming_ = opt_.from_end;
  return Status::OK();
}

void LogWatcher::OnUpdate(const LogEventUpdate& u) {
  if (u.open) {
    open_[u.id] = u.event;
  } else {
    open_.erase(u.id);
    closed_[u.id] = u.event.kind;
  }
  if (!priming_) Journal(u, "");
}

void LogWatcher::Journal(const LogEventUpdate& u, const std::string& suffix) {
  const LogEvent& e = u.event;
  const bool was_open = reported_open_.count(u.id) > 0;
  if (u.open)
    reported_open_.insert(u.id);
  else
    reported_open_.erase(u.id);
  const int64_t iteration = u.open ? e.start : e.end;
  const std::string where = u.open || e.start == e.end || e.kind == "restart"
                                ? fmt::format("iteration {}", iteration)
                                : fmt::format("iterations {}-{}", e.start, e.end);
  const std::string detail = e.detail + suffix;
  const std::string sentence =
      fmt::format("{}: {}{}: {}", where, e.kind, u.open ? " detected" : "", detail);
  WatchFindingEvent finding;
  finding.ended = !(u.open || !was_open);
  finding.kind_name = e.kind;
  finding.open = u.open;
  finding.start = e.start;
  finding.end = e.end;
  finding.iteration = iteration;
  finding.signal = e.signal;
  finding.value = e.value;
  finding.baseline = e.baseline;
  finding.detail = detail;
  finding.log = opt_.log;
  Record(finding, sentence);
  if (opt_.kill_switch.empty() || killed_ || !opt_.kill_on.count(e.kind)) return;
  // The kill switch: once, on the first finding of a chosen kind.
  killed_ = true;
  if (env_->FileExists(opt_.kill_switch)) {
    out_(fmt::format("note: the kill switch {} exists already: left as it is", opt_.kill_switch));
    return;
  }
  Status st = WriteFileAtomic(env_, opt_.kill_switch,
                              fmt::format("keel logs watch {}: {}\n", opt_.log, sentence));
  if (!st.ok()) {
    out_(fmt::format("WARNING: cannot create the kill switch {}: {}", opt_.kill_switch,
                     st.message()));
    return;
  }
  WatchKillSwitchEvent kill;
  kill.kind_name = e.kind;
  kill.iteration = iteration;
  kill.path = opt_.kill_switch;
  kill.log = opt_.log;
  Record(kill, fmt::format("iteration {}: created the kill switch {} ({}): a run started with "
                           "--kill-switch-path {} saves and stops at its next check",
                           iteration, opt_.kill_switch, e.kind, opt_.kill_switch));
}

void LogWatcher::Record(const JournalEvent& event, const std::string& sentence, bool run_hook) {
  nlohmann::json entry = event.ToJson();
  entry[kEventAtKey] = UtcTimestamp();
  if (journal_) journal_->Append(entry, sentence);
  ++entries_;
  if (!run_hook || !runner_ || opt_.on_event.empty()) return;
  auto field = [&](const char* key) {
    if (!entry.contains(key)) return std::string();
    const nlohmann::json& v = entry[key];
    return v.is_string() ? v.get<std::string>() : Dump(v);
  };
  const std::vector<std::pair<std::string, std::string>> vars = {
      {"KEEL_EVENT", field(kEventKey)},
      {"KEEL_EVENT_KIND", field("kind")},
      {"KEEL_EVENT_OPEN", entry.value("open", false) ? "1" : "0"},
      {"KEEL_EVENT_START", field("start")},
      {"KEEL_EVENT_END", field("end")},
      {"KEEL_EVENT_ITERATION", field("iteration")},
      {"KEEL_EVENT_SENTENCE", sentence},
      {"KEEL_EVENT_LOG", opt_.log},
      {"KEEL_EVENT_JSON", Dump(entry)}};
  const std::string label = fmt::format("--on-event for {} {} at iteration {}", field("kind"),
                                        field(kEventKey), field("iteration"));
  if (queued_hooks_.empty() && runner_->running() < opt_.max_running_hooks) {
    StartHook(label, vars, Dump(entry) + "\n");
  } else if (static_cast<int64_t>(queued_hooks_.size()) < opt_.max_queued_hooks) {
    queued_hooks_.push_back({label, vars, Dump(entry) + "\n"});
  } else {
    ++hooks_dropped_;
  }
}

void LogWatcher::StartHook(const std::string& label,
                           const std::vector<std::pair<std::string, std::string>>& vars,
                           const std::string& stdin_text) {
  Status st = runner_->Start(label, opt_.on_event, vars, stdin_text, opt_.on_event_timeout_s);
  if (!st.ok()) out_(fmt::format("WARNING: {}: {}", label, st.message()));
}

void LogWatcher::ReapCommands() {
  if (!runner_) return;
  for (const CommandEnd& end : runner_->Reap())
    if (!end.ok) out_(fmt::format("WARNING: {} {}", end.label, end.what));
  while (!queued_hooks_.empty() && runner_->running() < opt_.max_running_hooks) {
    const QueuedHook h = std::move(queued_hooks_.front());
    queued_hooks_.pop_front();
    StartHook(h.label, h.vars, h.stdin_text);
  }
  JournalDroppedHooks(
      fmt::format("{} were running and {} waiting to start, the most --max-running-hooks and "
                  "--max-queued-hooks allow",
                  opt_.max_running_hooks, opt_.max_queued_hooks));
}

void LogWatcher::JournalDroppedHooks(const std::string& reason) {
  const int64_t n = hooks_dropped_ - hooks_dropped_journaled_;
  if (n == 0) return;
  hooks_dropped_journaled_ = hooks_dropped_;
  HooksDroppedEvent dropped;
  dropped.count = n;
  dropped.total = hooks_dropped_;
  dropped.max_running_hooks = opt_.max_running_hooks;
  dropped.max_queued_hooks = opt_.max_queued_hooks;
  dropped.reason = reason;
  dropped.log = opt_.log;
  Record(dropped,
         fmt::format("--on-event: {} command{} not run ({} this watch): {}", n, n == 1 ? "" : "s",
                     hooks_dropped_, reason),
         /*run_hook=*/false);
}

void LogWatcher::Take() {
  for (const LogRecord& r : parsed_.records) {
    ++records_;
    if (first_iteration_ < 0) first_iteration_ = r.iteration;
    last_iteration_ = r.iteration;
    max_iteration_ = std::max(max_iteration_, r.iteration);
    train_iters_ = r.train_iters;
    if (!r.gap && std::isfinite(r.iteration_seconds)) {
      recent_seconds_.push_back(r.iteration_seconds);
      if (recent_seconds_.size() > 20) recent_seconds_.pop_front();
    }
    scanner_->Add(r);
  }
  parsed_.records.clear();
  validations_ += static_cast<int64_t>(parsed_.validations.size());
  parsed_.validations.clear();
  for (const RejectedLine& r : parsed_.rejected) {
    ++refused_;
    if (!priming_)
      out_(fmt::format("note: refused {}:{}: {} (not analyzed)", r.file, r.line, r.reason));
  }
  parsed_.rejected.clear();
}

void LogWatcher::EndPriming() {
  priming_ = false;
  if (records_ > 0)
    out_(fmt::format(
        "note: --from-end: the {} records already in {} (iterations {} to {}{}) primed the "
        "detectors; what is written from now on is reported",
        records_, opt_.log, first_iteration_, last_iteration_,
        refused_ > 0 ? fmt::format("; {} lines refused", refused_) : ""));
  for (const auto& [id, e] : open_) Journal({id, true, e}, " (open when the watch began)");
}

Status LogWatcher::Poll(bool* more, bool* read) {
  std::vector<FollowedItem> items;
  const uint64_t before = follower_.bytes_read();
  KEEL_RETURN_IF_ERROR(follower_.Poll(&items, more));
  *read = follower_.bytes_read() != before;
  for (const FollowedItem& item : items) {
    switch (item.kind) {
      case FollowedItem::Kind::kLine:
        parser_.AddLine(item.text);
        break;
      case FollowedItem::Kind::kNewFile:
        parser_.ContinueInFile(opt_.log);
        out_("note: " + item.text);
        break;
      case FollowedItem::Kind::kNote:
        out_("note: " + item.text);
        break;
    }
  }
  Take();
  if (priming_ && !*more) EndPriming();
  ReapCommands();
  return Status::OK();
}

Status LogWatcher::Run(const std::function<std::string()>& stop, std::string* why) {
  uint64_t quiet_since = env_->NowMicros();
  const uint64_t poll_us = static_cast<uint64_t>(std::max(opt_.poll_seconds, 0.001) * 1e6);
  for (;;) {
    *why = stop ? stop() : "";
    if (!why->empty()) return Status::OK();
    bool more = false, read = false;
    KEEL_RETURN_IF_ERROR(Poll(&more, &read));
    const uint64_t now = env_->NowMicros();
    if (read) quiet_since = now;
    if (more) continue;
    if (opt_.until_idle_seconds > 0 &&
        static_cast<double>(now - quiet_since) >= opt_.until_idle_seconds * 1e6) {
      *why =
          fmt::format("{} was quiet for {:g} s (--until-idle)", opt_.log, opt_.until_idle_seconds);
      return Status::OK();
    }
    // In slices, so that a stop request is seen within a tenth of a second.
    for (uint64_t left = poll_us; left > 0;) {
      if (stop && !stop().empty()) break;
      const uint64_t slice = std::min<uint64_t>(left, 100000);
      env_->SleepForMicros(slice);
      left -= slice;
    }
  }
}

void LogWatcher::Finish(const std::string& why) {
  if (finished_) return;
  finished_ = true;
  std::string partial;
  if (follower_.TakePartialLine(&partial)) parser_.AddLine(partial);
  parser_.Flush();
  Take();
  if (priming_) EndPriming();
  scanner_->Finish("the end of the watch");
  ReapCommands();
  // Commands still queued would start after the watcher is gone, past any limit: not run.
  hooks_dropped_ += static_cast<int64_t>(queued_hooks_.size());
  queued_hooks_.clear();
  JournalDroppedHooks("the watch ended before they could start");
  out_("watch: stopped: " + why);
  out_(fmt::format(
      "watch: read {} lines of {} ({} file{}): {} iteration records{}, {} validation lines{}",
      parsed_.lines, opt_.log, follower_.files(), follower_.files() == 1 ? "" : "s", records_,
      records_ > 0 ? fmt::format(" (iterations {} to {}, the last {})", first_iteration_,
                                 max_iteration_, last_iteration_)
                   : std::string(),
      validations_, refused_ > 0 ? fmt::format(", {} lines refused", refused_) : ""));
  std::map<std::string, int64_t> kinds;
  for (const auto& [id, kind] : closed_) ++kinds[kind];
  std::string findings;
  for (const auto& [kind, n] : kinds)
    findings += fmt::format("{}{} {}", findings.empty() ? "" : ", ", n, kind);
  out_(fmt::format("watch: findings: {}; restarts {}, skipped iterations {}, NaN iterations {}",
                   findings.empty() ? "none" : findings, scanner_->restarts(),
                   scanner_->skipped_iterations(), scanner_->nan_iterations()));
  if (train_iters_ > 0 && last_iteration_ >= 0 && last_iteration_ <= train_iters_ &&
      !recent_seconds_.empty()) {
    const double secs =
        MedianOf(std::vector<double>(recent_seconds_.begin(), recent_seconds_.end()));
    out_(fmt::format(
        "watch: ETA {:.2f} days ({} iterations left at {:.4g} s, the median of the last records; "
        "no downtime counted)",
        static_cast<double>(train_iters_ - last_iteration_) * secs / 86400,
        train_iters_ - last_iteration_, secs));
  }
  out_(fmt::format("watch: journal: {} entries this watch in {}/{} and {}/{}", entries_,
                   opt_.out_dir, kEventsFile, opt_.out_dir, kChronicleFile));
  if (runner_ && runner_->running() > 0)
    out_(fmt::format(
        "note: {} --on-event command{} still running: left to finish on {} own (each is ended at "
        "its timeout of {:g} s)",
        runner_->running(), runner_->running() == 1 ? " is" : "s are",
        runner_->running() == 1 ? "its" : "their", opt_.on_event_timeout_s));
}

}  // namespace keel

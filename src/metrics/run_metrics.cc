#include "metrics/run_metrics.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <sstream>
#include <unordered_set>

#include "core/timestamp.h"
#include "metrics/tf_event.h"

namespace keel {
namespace {

double WallTime() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The x-axis limit of a tag at a rewind: samples, tokens or iterations.
int64_t LimitFor(const std::string& tag, const MetricsPosition& at) {
  const std::string axis = TagAxisSuffix(tag);
  return axis == " vs samples" ? at.samples : axis == " vs tokens" ? at.tokens : at.iteration;
}

// An archive being assembled (metrics-archive/.partial-NAME): never read, removed if left over.
constexpr const char* kPartialPrefix = ".partial-";

// `to` as a second name of `from` (no data copied), or a copy of `bytes` (its content) where the
// filesystem refuses hard links.
Status LinkOrCopy(Env* env, const std::string& from, const std::string& to,
                  const std::string& bytes) {
  if (env->LinkFile(from, to).ok()) return Status::OK();
  std::unique_ptr<WritableFile> f;
  KEEL_RETURN_IF_ERROR(env->NewWritableFile(to, &f));
  KEEL_RETURN_IF_ERROR(f->Append(bytes));
  KEEL_RETURN_IF_ERROR(f->Sync());
  return f->Close();
}

}  // namespace

Status RunMetrics::Open(Env* env, const std::string& run_dir, std::unique_ptr<RunMetrics>* out) {
  return Open(env, run_dir, TensorBoardOptions(), out);
}

Status RunMetrics::Open(Env* env, const std::string& run_dir, const TensorBoardOptions& tb,
                        std::unique_ptr<RunMetrics>* out) {
  auto m = std::unique_ptr<RunMetrics>(new RunMetrics());
  m->env_ = env;
  m->dir_ = run_dir;
  m->tb_ = tb;
  m->tb_dir_ = !tb.dir.empty() ? tb.dir : run_dir.empty() ? "" : JoinPath(run_dir, kTensorBoardDir);
  *out = std::move(m);
  return Status::OK();
}

Status RunMetrics::OpenLive() {
  if ((dir_.empty() && tb_dir_.empty()) || jsonl_ || events_) return Status::OK();
  if (!dir_.empty()) {
    KEEL_RETURN_IF_ERROR(env_->CreateDirs(dir_));
    KEEL_RETURN_IF_ERROR(env_->NewAppendableFile(JoinPath(dir_, kMetricsFile), &jsonl_));
  }
  const std::string& tb = tb_dir_;
  KEEL_RETURN_IF_ERROR(env_->CreateDirs(tb));
  char host[256] = "localhost";
  ::gethostname(host, sizeof(host) - 1);
  const double now = WallTime();
  const std::string name = fmt::format("events.out.tfevents.{}.{}.{}.{}", static_cast<int64_t>(now),
                                       host, ::getpid(), env_->NowMicros());
  // Never an existing name: an old file may be a hard link into the archive (Rewind), and
  // truncating it would empty the archived copy too.
  std::string path = JoinPath(tb, name);
  for (int k = 1; env_->FileExists(path); ++k) path = JoinPath(tb, fmt::format("{}-{}", name, k));
  KEEL_RETURN_IF_ERROR(env_->NewWritableFile(path, &events_));
  KEEL_RETURN_IF_ERROR(events_->Append(FrameRecord(EncodeFileVersionEvent(now))));
  return events_->Flush();
}

Status RunMetrics::Rewind(const MetricsPosition& at, const std::string& reason,
                          std::string* archived) {
  if (!failed_.ok()) return failed_;
  failed_ = DoRewind(at, reason, archived);
  return failed_;
}

Status RunMetrics::DoRewind(const MetricsPosition& at, const std::string& reason,
                            std::string* archived) {
  if (archived) archived->clear();
  if (dir_.empty() && tb_dir_.empty()) return Status::OK();
  // Close the live files of this process first: they are about to be replaced.
  if (jsonl_) KEEL_RETURN_IF_ERROR(jsonl_->Close());
  if (events_) KEEL_RETURN_IF_ERROR(events_->Close());
  jsonl_.reset();
  events_.reset();
  last_iteration_ = at.iteration;

  const std::string jsonl_path = dir_.empty() ? std::string() : JoinPath(dir_, kMetricsFile);
  const std::string& tb = tb_dir_;
  std::string jsonl_text, kept_jsonl;
  int64_t later = 0, last_seen = at.iteration;
  if (!jsonl_path.empty() && env_->FileExists(jsonl_path)) {
    KEEL_RETURN_IF_ERROR(env_->ReadFileToString(jsonl_path, &jsonl_text));
    std::istringstream in(jsonl_text);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      const auto j = nlohmann::json::parse(line, nullptr, false);
      // A torn last line (a crash mid-write) or a line that is not a record stays in the archive
      // only; it never stops a resume.
      if (!j.is_object() || !j.contains("iteration") || !j["iteration"].is_number_integer())
        continue;
      const int64_t it = j["iteration"].get<int64_t>();
      if (it > at.iteration) {
        ++later;
        last_seen = std::max(last_seen, it);
      } else {
        kept_jsonl += line + "\n";
      }
    }
  }
  struct EventFile {
    std::string name, bytes;
  };
  std::vector<EventFile> event_files;
  std::string kept_events;
  if (env_->IsDirectory(tb)) {
    std::vector<std::string> names;
    KEEL_RETURN_IF_ERROR(env_->GetChildren(tb, &names));
    std::sort(names.begin(), names.end());
    // An event kept twice (a crash between writing the new live file and removing the old ones)
    // is kept once.
    std::unordered_set<std::string> seen;
    for (const std::string& n : names) {
      if (n.find("tfevents") == std::string::npos) continue;
      EventFile f{n, ""};
      KEEL_RETURN_IF_ERROR(env_->ReadFileToString(JoinPath(tb, n), &f.bytes));
      std::vector<DecodedEvent> evs;
      // A file cut short by a crash keeps its complete records.
      Status ps = ParseEventFile(f.bytes, JoinPath(tb, n), &evs);
      (void)ps;
      for (const DecodedEvent& e : evs) {
        if (!e.file_version.empty()) continue;
        if (e.step > LimitFor(e.tag, at)) {
          ++later;
          continue;
        }
        if (seen.insert(e.data).second) kept_events += FrameRecord(e.data);
      }
      event_files.push_back(std::move(f));
    }
  }
  if (later == 0) return Status::OK();

  // 1. The archive, complete before anything live changes: built under a hidden name (hard links
  //    to the live files, copies where links are refused), then renamed into place. A crash
  //    leaves the live files whole and at most a hidden partial archive, removed next time.
  // Without a run directory (--tensorboard-dir alone) the archive goes beside the events.
  const std::string root = JoinPath(dir_.empty() ? tb_dir_ : dir_, kMetricsArchiveDir);
  KEEL_RETURN_IF_ERROR(env_->CreateDirs(root));
  std::vector<std::string> entries;
  KEEL_RETURN_IF_ERROR(env_->GetChildren(root, &entries));
  int64_t seq = 1;
  for (const std::string& e : entries) {
    if (e.rfind(kPartialPrefix, 0) == 0)
      KEEL_RETURN_IF_ERROR(env_->RemoveDirRecursive(JoinPath(root, e)));
    else if (!e.empty() && e[0] != '.')
      ++seq;
  }
  // The name says what happened; the sequence number keeps names unique when two rewinds to the
  // same iteration fall in the same second (a crash loop).
  const std::string base =
      fmt::format("{}-iter{}-to-iter{}-{}", reason, last_seen, at.iteration,
                  UtcTimestampCompact(static_cast<std::time_t>(env_->NowUnixMicros() / 1000000)));
  std::string name = fmt::format("{}-{}", base, seq);
  while (env_->FileExists(JoinPath(root, name))) name = fmt::format("{}-{}", base, ++seq);
  const std::string arch = JoinPath(root, name);
  const std::string staging = JoinPath(root, kPartialPrefix + name);
  KEEL_RETURN_IF_ERROR(env_->CreateDirs(JoinPath(staging, kTensorBoardDir)));
  if (!jsonl_path.empty() && env_->FileExists(jsonl_path))
    KEEL_RETURN_IF_ERROR(LinkOrCopy(env_, jsonl_path, JoinPath(staging, kMetricsFile), jsonl_text));
  for (const EventFile& f : event_files)
    KEEL_RETURN_IF_ERROR(LinkOrCopy(env_, JoinPath(tb, f.name),
                                    JoinPath(JoinPath(staging, kTensorBoardDir), f.name), f.bytes));
  KEEL_RETURN_IF_ERROR(env_->SyncDir(JoinPath(staging, kTensorBoardDir)));
  KEEL_RETURN_IF_ERROR(env_->SyncDir(staging));
  KEEL_RETURN_IF_ERROR(env_->RenameFile(staging, arch));
  KEEL_RETURN_IF_ERROR(env_->SyncDir(root));

  // 2. The live files, each replaced whole: metrics.jsonl atomically, then a new event file with
  //    what is kept, then the old event files go (the archive holds them).
  if (!jsonl_path.empty()) KEEL_RETURN_IF_ERROR(WriteFileAtomic(env_, jsonl_path, kept_jsonl));
  KEEL_RETURN_IF_ERROR(OpenLive());
  KEEL_RETURN_IF_ERROR(events_->Append(kept_events));
  KEEL_RETURN_IF_ERROR(events_->Sync());
  for (const EventFile& f : event_files)
    KEEL_RETURN_IF_ERROR(env_->RemoveFile(JoinPath(tb, f.name)));
  KEEL_RETURN_IF_ERROR(env_->SyncDir(tb));
  if (archived) *archived = arch;
  return Status::OK();
}

Status RunMetrics::WriteScalar(int64_t step, const std::string& tag, double value, double wall) {
  if (!std::isfinite(value)) return Status::OK();  // TensorBoard has no use for NaN points
  return events_->Append(
      FrameRecord(EncodeScalarEvent(wall, step, tag, static_cast<float>(value))));
}

Status RunMetrics::Append(const nlohmann::json& r) {
  if (dir_.empty() && tb_dir_.empty()) return Status::OK();
  if (!failed_.ok()) return failed_;
  const bool train = r.value("kind", "") == "train";
  const int64_t it = r.value("iteration", int64_t{0});
  if (train && last_iteration_ >= 0 && it <= last_iteration_) {
    // The run went back: the state is that after iteration it - 1.
    const int64_t gb = r.value("global_batch_size", int64_t{0});
    const int64_t samples = r.value("consumed_samples", int64_t{0});
    const int64_t tokens = r.value("consumed_tokens", int64_t{0});
    const int64_t per_sample = samples > 0 ? tokens / samples : 0;
    KEEL_RETURN_IF_ERROR(
        Rewind({it - 1, samples - gb, tokens - gb * per_sample}, "rollback", nullptr));
  }
  KEEL_RETURN_IF_ERROR(OpenLive());
  if (train) last_iteration_ = it;
  // A name that is not UTF-8 (a dataset path) is written with U+FFFD rather than thrown on.
  if (jsonl_) {
    KEEL_RETURN_IF_ERROR(
        jsonl_->Append(r.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n"));
    KEEL_RETURN_IF_ERROR(jsonl_->Flush());
  }
  if (!events_) return Status::OK();

  const double wall = WallTime();
  const int64_t samples = r.value("consumed_samples", int64_t{0});
  auto num = [&](const nlohmann::json& j, const char* key) {
    return j.contains(key) && j[key].is_number() ? j[key].get<double>() : NAN;
  };
  // Megatron-DeepSpeed's grouped tags: GROUP/NAME against iterations, GROUP/NAME vs samples.
  auto both = [&](const std::string& tag, double v) -> Status {
    KEEL_RETURN_IF_ERROR(WriteScalar(it, tag, v, wall));
    return WriteScalar(samples, tag + " vs samples", v, wall);
  };
  if (train) {
    // An iteration of a skipped data window trained nothing: no loss, grad norm or throughput
    // (whatever a record carries for its near-zero time), so TensorBoard draws a gap too.
    const bool data_skipped = r.value("data_skipped", false);
    if (!data_skipped) {
      KEEL_RETURN_IF_ERROR(both("lm-loss-training/lm loss", num(r, "lm_loss")));
      KEEL_RETURN_IF_ERROR(WriteScalar(r.value("consumed_tokens", int64_t{0}),
                                       "lm-loss-training/lm loss vs tokens", num(r, "lm_loss"),
                                       wall));
      KEEL_RETURN_IF_ERROR(both("grad-norm/grad-norm", num(r, "grad_norm")));
      KEEL_RETURN_IF_ERROR(WriteScalar(it, "num-zeros/num-zeros", num(r, "num_zeros"), wall));
    }
    KEEL_RETURN_IF_ERROR(both("learning-rate/learning-rate", num(r, "learning_rate")));
    if (tb_.batch_size)
      KEEL_RETURN_IF_ERROR(both("batch-size/batch-size", num(r, "global_batch_size")));
    KEEL_RETURN_IF_ERROR(both("loss-scale/loss-scale", num(r, "loss_scale")));
    if (tb_.timers) {
      // Megatron-DeepSpeed's --log-timers-to-tensorboard tags.
      const double secs = num(r, "iteration_ms") / 1000.0;
      KEEL_RETURN_IF_ERROR(both("iteration-time/iteration-time", secs));
      KEEL_RETURN_IF_ERROR(WriteScalar(r.value("consumed_tokens", int64_t{0}),
                                       "iteration-time/iteration-time vs tokens", secs, wall));
      if (!data_skipped) {
        const double sps = num(r, "samples_per_second");
        const double tokens_per_sample =
            samples > 0 ? static_cast<double>(r.value("consumed_tokens", int64_t{0})) / samples
                        : NAN;
        KEEL_RETURN_IF_ERROR(WriteScalar(it, "iteration-time/samples per second", sps, wall));
        KEEL_RETURN_IF_ERROR(
            WriteScalar(it, "iteration-time/tokens per second", sps * tokens_per_sample, wall));
      }
      if (r.contains("timers_ms") && r["timers_ms"].is_object())
        for (const auto& [name, ms] : r["timers_ms"].items())
          if (ms.is_number())
            KEEL_RETURN_IF_ERROR(
                WriteScalar(it, "time/" + name + "-time", ms.get<double>() / 1000.0, wall));
    }
    if (!data_skipped) {
      KEEL_RETURN_IF_ERROR(
          WriteScalar(it, "throughput/samples per second", num(r, "samples_per_second"), wall));
      KEEL_RETURN_IF_ERROR(WriteScalar(it, "throughput/TFLOPs", num(r, "tflops"), wall));
    }
    if (r.contains("datasets"))
      for (const auto& [name, d] : r["datasets"].items())
        KEEL_RETURN_IF_ERROR(both("lm-loss-training/" + name + " lm loss", num(d, "lm_loss")));
  } else {
    KEEL_RETURN_IF_ERROR(both("lm-loss-validation/lm loss validation", num(r, "lm_loss")));
    if (tb_.validation_ppl)
      KEEL_RETURN_IF_ERROR(
          both("lm-loss-validation/lm loss validation ppl", num(r, "lm_loss_ppl")));
    if (r.contains("datasets"))
      for (const auto& [name, d] : r["datasets"].items()) {
        KEEL_RETURN_IF_ERROR(
            both("lm-loss-validation/" + name + " lm loss validation", num(d, "lm_loss")));
        if (tb_.validation_ppl)
          KEEL_RETURN_IF_ERROR(both("lm-loss-validation/" + name + " lm loss validation ppl",
                                    num(d, "lm_loss_ppl")));
      }
  }
  return events_->Flush();
}

Status RunMetrics::AppendText(int64_t iteration, const std::string& tag, const std::string& text) {
  if (tb_dir_.empty()) return Status::OK();
  if (!failed_.ok()) return failed_;
  KEEL_RETURN_IF_ERROR(OpenLive());
  KEEL_RETURN_IF_ERROR(
      events_->Append(FrameRecord(EncodeTextEvent(WallTime(), iteration, tag, text))));
  return events_->Flush();
}

Status RunMetrics::AppendScalar(int64_t iteration, const std::string& tag, double value) {
  if (tb_dir_.empty()) return Status::OK();
  if (!failed_.ok()) return failed_;
  KEEL_RETURN_IF_ERROR(OpenLive());
  KEEL_RETURN_IF_ERROR(WriteScalar(iteration, tag, value, WallTime()));
  return events_->Flush();
}

}  // namespace keel

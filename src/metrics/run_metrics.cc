#include "metrics/run_metrics.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <sstream>

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

}  // namespace

Status RunMetrics::Open(Env* env, const std::string& run_dir, std::unique_ptr<RunMetrics>* out) {
  auto m = std::unique_ptr<RunMetrics>(new RunMetrics());
  m->env_ = env;
  m->dir_ = run_dir;
  *out = std::move(m);
  return Status::OK();
}

Status RunMetrics::OpenLive() {
  if (dir_.empty() || jsonl_) return Status::OK();
  KEEL_RETURN_IF_ERROR(env_->NewAppendableFile(JoinPath(dir_, kMetricsFile), &jsonl_));
  const std::string tb = JoinPath(dir_, kTensorBoardDir);
  KEEL_RETURN_IF_ERROR(env_->CreateDirs(tb));
  char host[256] = "localhost";
  ::gethostname(host, sizeof(host) - 1);
  const double now = WallTime();
  const std::string name = fmt::format("events.out.tfevents.{}.{}.{}.{}", static_cast<int64_t>(now),
                                       host, ::getpid(), env_->NowMicros());
  KEEL_RETURN_IF_ERROR(env_->NewWritableFile(JoinPath(tb, name), &events_));
  KEEL_RETURN_IF_ERROR(events_->Append(FrameRecord(EncodeFileVersionEvent(now))));
  return events_->Flush();
}

Status RunMetrics::Rewind(const MetricsPosition& at, const std::string& reason,
                          std::string* archived) {
  if (archived) archived->clear();
  if (dir_.empty()) return Status::OK();
  // Close the live files of this process first: they are about to move.
  if (jsonl_) KEEL_RETURN_IF_ERROR(jsonl_->Close());
  if (events_) KEEL_RETURN_IF_ERROR(events_->Close());
  jsonl_.reset();
  events_.reset();
  last_iteration_ = at.iteration;

  const std::string jsonl_path = JoinPath(dir_, kMetricsFile);
  const std::string tb = JoinPath(dir_, kTensorBoardDir);
  std::string kept_jsonl;
  int64_t later = 0, last_seen = at.iteration;
  if (env_->FileExists(jsonl_path)) {
    std::string text;
    KEEL_RETURN_IF_ERROR(env_->ReadFileToString(jsonl_path, &text));
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      const auto j = nlohmann::json::parse(line, nullptr, false);
      const int64_t it = j.is_object() ? j.value("iteration", int64_t{0}) : 0;
      if (it > at.iteration) {
        ++later;
        last_seen = std::max(last_seen, it);
      } else if (!j.is_discarded()) {  // a torn last line (a crash mid-write) is not kept
        kept_jsonl += line + "\n";
      }
    }
  }
  std::vector<std::string> event_files;
  std::string kept_events;
  if (env_->IsDirectory(tb)) {
    std::vector<std::string> names;
    KEEL_RETURN_IF_ERROR(env_->GetChildren(tb, &names));
    std::sort(names.begin(), names.end());
    for (const std::string& n : names) {
      if (n.find("tfevents") == std::string::npos) continue;
      event_files.push_back(n);
      std::string bytes;
      KEEL_RETURN_IF_ERROR(env_->ReadFileToString(JoinPath(tb, n), &bytes));
      std::vector<DecodedEvent> evs;
      // A file cut short by a crash keeps its complete records.
      Status ps = ParseEventFile(bytes, JoinPath(tb, n), &evs);
      (void)ps;
      for (const DecodedEvent& e : evs) {
        if (!e.file_version.empty()) continue;
        if (e.step > LimitFor(e.tag, at)) {
          ++later;
          continue;
        }
        kept_events += FrameRecord(e.data);
      }
    }
  }
  if (later == 0) return Status::OK();

  // Move the live files aside whole, then write what is kept as the new live files.
  const std::string name =
      fmt::format("{}-iter{}-to-iter{}-{}", reason, last_seen, at.iteration, UtcTimestampCompact());
  const std::string arch = JoinPath(JoinPath(dir_, kMetricsArchiveDir), name);
  KEEL_RETURN_IF_ERROR(env_->CreateDirs(arch));
  if (env_->FileExists(jsonl_path))
    KEEL_RETURN_IF_ERROR(env_->RenameFile(jsonl_path, JoinPath(arch, kMetricsFile)));
  if (env_->IsDirectory(tb))
    KEEL_RETURN_IF_ERROR(env_->RenameFile(tb, JoinPath(arch, kTensorBoardDir)));
  KEEL_RETURN_IF_ERROR(env_->SyncDir(arch));
  KEEL_RETURN_IF_ERROR(env_->SyncDir(dir_));
  KEEL_RETURN_IF_ERROR(WriteFileAtomic(env_, jsonl_path, kept_jsonl));
  KEEL_RETURN_IF_ERROR(OpenLive());
  KEEL_RETURN_IF_ERROR(events_->Append(kept_events));
  KEEL_RETURN_IF_ERROR(events_->Flush());
  if (archived) *archived = arch;
  return Status::OK();
}

Status RunMetrics::WriteScalar(int64_t step, const std::string& tag, double value, double wall) {
  if (!std::isfinite(value)) return Status::OK();  // TensorBoard has no use for NaN points
  return events_->Append(
      FrameRecord(EncodeScalarEvent(wall, step, tag, static_cast<float>(value))));
}

Status RunMetrics::Append(const nlohmann::json& r) {
  if (dir_.empty()) return Status::OK();
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
  KEEL_RETURN_IF_ERROR(jsonl_->Append(r.dump() + "\n"));
  KEEL_RETURN_IF_ERROR(jsonl_->Flush());

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
    if (!r.value("data_skipped", false)) {
      KEEL_RETURN_IF_ERROR(both("lm-loss-training/lm loss", num(r, "lm_loss")));
      KEEL_RETURN_IF_ERROR(WriteScalar(r.value("consumed_tokens", int64_t{0}),
                                       "lm-loss-training/lm loss vs tokens", num(r, "lm_loss"),
                                       wall));
      KEEL_RETURN_IF_ERROR(both("grad-norm/grad-norm", num(r, "grad_norm")));
      KEEL_RETURN_IF_ERROR(WriteScalar(it, "num-zeros/num-zeros", num(r, "num_zeros"), wall));
    }
    KEEL_RETURN_IF_ERROR(both("learning-rate/learning-rate", num(r, "learning_rate")));
    KEEL_RETURN_IF_ERROR(both("batch-size/batch-size", num(r, "global_batch_size")));
    KEEL_RETURN_IF_ERROR(both("loss-scale/loss-scale", num(r, "loss_scale")));
    KEEL_RETURN_IF_ERROR(both("iteration-time/iteration-time", num(r, "iteration_ms") / 1000.0));
    KEEL_RETURN_IF_ERROR(
        WriteScalar(it, "throughput/samples per second", num(r, "samples_per_second"), wall));
    KEEL_RETURN_IF_ERROR(WriteScalar(it, "throughput/TFLOPs", num(r, "tflops"), wall));
    if (r.contains("datasets"))
      for (const auto& [name, d] : r["datasets"].items())
        KEEL_RETURN_IF_ERROR(both("lm-loss-training/" + name + " lm loss", num(d, "lm_loss")));
  } else {
    KEEL_RETURN_IF_ERROR(both("lm-loss-validation/lm loss validation", num(r, "lm_loss")));
    KEEL_RETURN_IF_ERROR(both("lm-loss-validation/lm loss validation ppl", num(r, "lm_loss_ppl")));
    if (r.contains("datasets"))
      for (const auto& [name, d] : r["datasets"].items()) {
        KEEL_RETURN_IF_ERROR(
            both("lm-loss-validation/" + name + " lm loss validation", num(d, "lm_loss")));
        KEEL_RETURN_IF_ERROR(
            both("lm-loss-validation/" + name + " lm loss validation ppl", num(d, "lm_loss_ppl")));
      }
  }
  return events_->Flush();
}

Status RunMetrics::AppendText(int64_t iteration, const std::string& tag, const std::string& text) {
  if (dir_.empty()) return Status::OK();
  KEEL_RETURN_IF_ERROR(OpenLive());
  KEEL_RETURN_IF_ERROR(
      events_->Append(FrameRecord(EncodeTextEvent(WallTime(), iteration, tag, text))));
  return events_->Flush();
}

}  // namespace keel

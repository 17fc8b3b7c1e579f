#include "metrics/metrics_log.h"

namespace keel {

Status MetricsLog::Open(Env* env, const std::string& path, std::unique_ptr<MetricsLog>* out) {
  auto log = std::make_unique<MetricsLog>();
  log->path_ = path;
  if (!path.empty()) KEEL_RETURN_IF_ERROR(env->NewAppendableFile(path, &log->file_));
  *out = std::move(log);
  return Status::OK();
}

Status MetricsLog::Append(const nlohmann::json& record) {
  if (!file_) return Status::OK();
  KEEL_RETURN_IF_ERROR(file_->Append(record.dump() + "\n"));
  return file_->Flush();
}

}  // namespace keel

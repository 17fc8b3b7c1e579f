// MetricsLog: the run's metrics stream, RUN/metrics.jsonl: one JSON object per line, one per
// iteration ("kind": "train", every field of the iteration line and the loss of each dataset of
// a mixture) and one per evaluation ("kind": "validation"). Appended and flushed line by line, so
// a crash loses at most the line being written.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "core/env.h"
#include "core/status.h"

namespace keel {

class MetricsLog {
 public:
  // Appends to `path` (created if absent). An empty path makes a log that writes nothing.
  static Status Open(Env* env, const std::string& path, std::unique_ptr<MetricsLog>* out);
  Status Append(const nlohmann::json& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::unique_ptr<WritableFile> file_;
};

}  // namespace keel

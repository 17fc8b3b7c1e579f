#include "core/log.h"

#include <mutex>

namespace keel {
namespace {

struct LogCopy {
  std::mutex mu;
  std::function<void(const std::string&)> sink;
  bool mute_stdout = false;
  std::string error_prefix;
};

LogCopy& Copy() {
  static LogCopy* c = new LogCopy;  // never destroyed: logging works during exit
  return *c;
}

void Write(FILE* f, const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), f);
  std::fflush(f);
}

}  // namespace

void LogLine(const std::string& line) {
  LogCopy& c = Copy();
  std::lock_guard<std::mutex> l(c.mu);
  if (!c.mute_stdout) Write(stdout, line + "\n");
  if (c.sink) c.sink(line);
}

void LogError(const std::string& line) {
  LogCopy& c = Copy();
  std::lock_guard<std::mutex> l(c.mu);
  Write(stderr, c.error_prefix + line + "\n");
  if (c.sink) c.sink(line);
}

void SetLogCopy(std::function<void(const std::string&)> sink, bool mute_stdout,
                std::string error_prefix) {
  LogCopy& c = Copy();
  std::lock_guard<std::mutex> l(c.mu);
  c.sink = std::move(sink);
  c.mute_stdout = mute_stdout;
  c.error_prefix = std::move(error_prefix);
}

}  // namespace keel

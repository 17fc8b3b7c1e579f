// Logging: every line goes out whole and is flushed at once (the m4 run lost real-time logs to
// buffering). Lines are written with one fwrite so concurrent writers never interleave mid-line.
#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <string>

namespace keel {

// Writes `line` plus '\n' to stdout and flushes.
void LogLine(const std::string& line);
// Writes to stderr and flushes (warnings and errors).
void LogError(const std::string& line);

template <typename... Args>
void Log(fmt::format_string<Args...> f, Args&&... args) {
  LogLine(fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void Warn(fmt::format_string<Args...> f, Args&&... args) {
  LogLine("WARNING: " + fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace keel

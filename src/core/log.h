// Logging: every line goes out whole and is flushed at once (the m4 run lost real-time logs to
// buffering). Lines are written with one fwrite so concurrent writers never interleave mid-line.
#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <functional>
#include <string>

namespace keel {

// Writes `line` plus '\n' to stdout (unless muted) and to the copy sink (if set), and flushes.
void LogLine(const std::string& line);
// Writes to stderr and flushes (warnings and errors), and to the copy sink (if set).
void LogError(const std::string& line);

// Data-parallel ranks: each rank's lines also go to `sink` (its SAVE/logs/rank-NNN.log), and the
// ranks other than 0 keep stdout quiet (`mute_stdout`) so the terminal shows one run; errors
// still reach stderr with `error_prefix` ("[rank 1] "). An empty sink removes the copy.
void SetLogCopy(std::function<void(const std::string&)> sink, bool mute_stdout,
                std::string error_prefix);

template <typename... Args>
void Log(fmt::format_string<Args...> f, Args&&... args) {
  LogLine(fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void Warn(fmt::format_string<Args...> f, Args&&... args) {
  LogLine("WARNING: " + fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace keel

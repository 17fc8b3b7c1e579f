#include "core/timestamp.h"

namespace keel {

std::string UtcTimestamp(std::time_t t) {
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string UtcTimestamp() {
  return UtcTimestamp(std::time(nullptr));
}

std::string UtcTimestampCompact(std::time_t t) {
  std::string out;
  for (char c : UtcTimestamp(t))
    if (c != '-' && c != ':') out += c;
  return out;
}

std::string UtcTimestampCompact() {
  return UtcTimestampCompact(std::time(nullptr));
}

}  // namespace keel

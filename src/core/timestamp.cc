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

std::string UtcTimestampCompact() {
  std::string out;
  for (char c : UtcTimestamp())
    if (c != '-' && c != ':') out += c;
  return out;
}

}  // namespace keel

// UtcTimestamp: ISO 8601 UTC to the second, and its compact form for file names.
#include "core/timestamp.h"

#include <gtest/gtest.h>

namespace keel {
namespace {

TEST(TimestampTest, FormatsUtcToTheSecond) {
  EXPECT_EQ(UtcTimestamp(0), "1970-01-01T00:00:00Z");
  EXPECT_EQ(UtcTimestamp(1795338245), "2026-11-22T09:04:05Z");  // UTC, whatever the local zone
}

TEST(TimestampTest, NowAndItsCompactFormAreTheCurrentTime) {
  const std::time_t before = std::time(nullptr);
  const std::string now = UtcTimestamp();
  const std::string compact = UtcTimestampCompact();
  const std::time_t after = std::time(nullptr);
  bool now_ok = false, compact_ok = false;
  for (std::time_t t = before; t <= after; ++t) {
    std::string stripped;
    for (char c : UtcTimestamp(t))
      if (c != '-' && c != ':') stripped += c;
    now_ok = now_ok || now == UtcTimestamp(t);
    compact_ok = compact_ok || compact == stripped;
  }
  EXPECT_TRUE(now_ok) << now;
  EXPECT_TRUE(compact_ok) << compact;
  EXPECT_EQ(compact.size(), 16u) << compact;  // 20261122T090405Z
}

}  // namespace
}  // namespace keel

// Wall-clock time as text, for records a person reads (state.json "saved_at", journal entries,
// edit history) and for the names of archive directories. Always UTC, to the second.
#pragma once

#include <ctime>
#include <string>

namespace keel {

// `t` as 2026-11-22T10:00:00Z (ISO 8601, UTC).
std::string UtcTimestamp(std::time_t t);
// The current time, as above.
std::string UtcTimestamp();
// The current time as 20261122T100000Z: the same, without '-' and ':', for file names.
std::string UtcTimestampCompact(std::time_t t);
std::string UtcTimestampCompact();

}  // namespace keel

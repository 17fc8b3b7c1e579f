// JSON has no NaN or Infinity: keel writes a non-finite number as null and reads null back as NaN
// (state.json's metric accumulators, the guard's signals and windows, metrics records).
#pragma once

#include <cmath>
#include <nlohmann/json.hpp>

namespace keel {

// `v`, or null when it is NaN or infinite.
inline nlohmann::json JsonNumber(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

// The number `j` holds, or NaN for null. Anything else throws nlohmann::json::type_error, so a
// reader that catches json::exception reports a malformed file instead of inventing a value.
inline double NumberFromJson(const nlohmann::json& j) {
  return j.is_null() ? NAN : j.get<double>();
}

}  // namespace keel

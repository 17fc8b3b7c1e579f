// Typed reads of JSON values from files keel may not have written (checkpoints, run directories,
// dataset metadata). nlohmann's get<int>() converts a number with a fraction or exponent by a
// static_cast (undefined behaviour outside the integer's range), and value() throws on a wrong
// type; these return "absent" instead, so the caller can name the file and the field.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>

namespace keel {

// `j` as Int when it is a JSON integer (no fraction or exponent) within Int's range.
template <typename Int>
std::optional<Int> JsonInt(const nlohmann::json& j) {
  if (j.is_number_unsigned()) {
    const uint64_t v = j.get<uint64_t>();
    if (std::in_range<Int>(v)) return static_cast<Int>(v);
  } else if (j.is_number_integer()) {
    const int64_t v = j.get<int64_t>();
    if (std::in_range<Int>(v)) return static_cast<Int>(v);
  }
  return std::nullopt;
}

// obj[key] as Int (see JsonInt); absent also when `obj` is not an object or lacks `key`.
template <typename Int>
std::optional<Int> JsonIntField(const nlohmann::json& obj, const char* key) {
  if (!obj.is_object()) return std::nullopt;
  const auto it = obj.find(key);
  if (it == obj.end()) return std::nullopt;
  return JsonInt<Int>(*it);
}

// obj[key] when it is a string, else `fallback`.
inline std::string JsonStringOr(const nlohmann::json& obj, const char* key, std::string fallback) {
  if (!obj.is_object()) return fallback;
  const auto it = obj.find(key);
  if (it == obj.end() || !it->is_string()) return fallback;
  return it->get<std::string>();
}

}  // namespace keel

// JsonReader: reads a JSON document from a file that a person can edit or a crash can damage
// (checkpoint state and manifests, dataset metadata, the guard's file, metrics records), so that
// every failure names the file, the key and what to do:
//
//   runs/x/iter_0000010/state.json: counters.iteration must be an integer, but is "ten"; FIX
//
// never a bare nlohmann message. The first failure is kept and later reads return their
// fallbacks, so a reader reads straight through and checks status() once:
//
//   JsonReader r(path, doc, "restore the file or delete it");
//   const JsonValue c = r.root()["counters"];
//   t.iteration = c["iteration"].Get<int64_t>();
//   t.skipped = c.Optional("skipped").Get<int64_t>(0);  // absent in older files
//   KEEL_RETURN_IF_ERROR(r.status());
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <vector>

#include "core/status.h"

namespace keel {

class JsonReader;

// A value of the document at a dotted path ("counters.iteration", "files[0].name"), or a missing
// one. Cheap to copy; valid while its JsonReader and document live.
class JsonValue {
 public:
  // Member `key`, which must exist (its absence is the reader's error).
  JsonValue operator[](const std::string& key) const;
  // Element `i` of an array, which must exist.
  JsonValue operator[](size_t i) const;
  // Member `key` when present; an absent value (Get returns its fallback) otherwise.
  JsonValue Optional(const std::string& key) const;
  // The elements of an array (none, with an error, for anything else; none for an absent value).
  std::vector<JsonValue> Items() const;

  bool present() const { return v_ != nullptr; }
  bool is_null() const { return v_ != nullptr && v_->is_null(); }
  // The value itself; null for an absent one.
  const nlohmann::json& raw() const;
  const std::string& path() const { return path_; }

  // The value as T (an integer type, double or float, bool, std::string): checked for type and
  // range; `fallback` when absent or after an error.
  template <typename T>
  T Get(T fallback = T{}) const;
  // A number, or NaN for null (how keel writes non-finite numbers, core/json_number.h).
  double Number(double fallback = NAN) const;

 private:
  friend class JsonReader;
  JsonValue(JsonReader* r, const nlohmann::json* v, std::string path)
      : r_(r), v_(v), path_(std::move(path)) {}
  std::string Child(const std::string& key) const;
  bool Expect(bool ok, const std::string& what) const;  // records "must be WHAT, but is ..."

  JsonReader* r_;
  const nlohmann::json* v_;  // null: absent
  std::string path_;
};

class JsonReader {
 public:
  // `file` names the document in messages; `fix` (may be empty) is appended to each: what the
  // user does about a damaged file.
  JsonReader(std::string file, const nlohmann::json& doc, std::string fix = "");
  // The reader keeps a reference to the document: a temporary would dangle.
  JsonReader(std::string file, const nlohmann::json&& doc, std::string fix = "") = delete;

  JsonValue root() { return JsonValue(this, &doc_, ""); }
  // OK, or Corruption naming the file, the key and the fix of the first failure.
  const Status& status() const { return status_; }
  bool ok() const { return status_.ok(); }
  // Records a failure of the caller's own (a value out of its range): "FILE: PATH MESSAGE; FIX".
  void Fail(const std::string& path, const std::string& message);

 private:
  std::string file_, fix_;
  const nlohmann::json& doc_;
  Status status_;
};

// "an integer", "the string \"ten\"", ...: how a JSON value reads in a message (long ones cut).
std::string DescribeJson(const nlohmann::json& v);

template <typename T>
T JsonValue::Get(T fallback) const {
  if (v_ == nullptr || !r_->ok()) return fallback;
  if constexpr (std::is_same_v<T, bool>) {
    return Expect(v_->is_boolean(), "true or false") ? v_->get<bool>() : fallback;
  } else if constexpr (std::is_integral_v<T>) {
    if (!Expect(v_->is_number_integer(), "an integer")) return fallback;
    bool fits;
    if (v_->is_number_unsigned()) {
      fits = v_->get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max());
    } else {
      const int64_t x = v_->get<int64_t>();
      fits = std::is_signed_v<T> ? x >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
                                       x <= static_cast<int64_t>(std::numeric_limits<T>::max())
                                 : x >= 0;
    }
    if (!Expect(fits, "an integer from " + std::to_string(std::numeric_limits<T>::min()) + " to " +
                          std::to_string(std::numeric_limits<T>::max())))
      return fallback;
    return v_->get<T>();
  } else if constexpr (std::is_floating_point_v<T>) {
    return Expect(v_->is_number(), "a number") ? v_->get<T>() : fallback;
  } else {
    static_assert(std::is_same_v<T, std::string>, "JsonValue::Get reads numbers, bools, strings");
    return Expect(v_->is_string(), "a string") ? v_->get<std::string>() : fallback;
  }
}

}  // namespace keel

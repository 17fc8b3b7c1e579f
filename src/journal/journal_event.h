// JournalEvent: one kind of line of a journal (events.jsonl, a checkpoint's history), as a typed
// value. Each kind is a struct whose `Fields(f)` calls f("key", member) for every field in the
// order written: the JSON line (ToJson), the reading back (FromJson), and the documented field
// list (EventSchemaOf, checked against docs/observability.md by a test) all come from that one
// list, so each key is spelled once.
//
//   struct SkipUpdateEvent final : JournalEvent {
//     KEEL_JOURNAL_EVENT(SkipUpdateEvent, "skip_update")
//     int64_t iteration = 0, onset = 0;
//     template <class F> void Fields(F& f) { f("iteration", iteration); f("onset", onset); }
//   };
//   journal->Append(ev, sentence);                       // + "at", the UTC time of the append
//   Status st = SkipUpdateEvent::FromJson(line, "events.jsonl line 3", &ev);
//
// Field types: int64_t, double (null when not finite), bool, std::string, NullableString (null
// when absent), nlohmann::json (any value), a struct with Fields (an object), std::vector of any
// of them (an array), and std::optional of any of them (left out when empty).
#pragma once

#include <cmath>
#include <concepts>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "core/json_reader.h"
#include "core/status.h"

namespace keel {

// The keys every journal line has: its kind, and the UTC time of the append (RunJournal adds it).
constexpr const char* kEventKey = "event";
constexpr const char* kEventAtKey = "at";

// A string written as null when there is none (the guard's "cause").
using NullableString = std::variant<std::nullptr_t, std::string>;

class JournalEvent {
 public:
  virtual ~JournalEvent() = default;
  // "rollback", "straggler", ...: the value of "event".
  virtual std::string kind() const = 0;
  // The line: "event" first, then the fields in their order; no "at" unless the kind carries its
  // own (the history's entries).
  virtual nlohmann::ordered_json ToJson() const = 0;
};

// The documented shape of a kind: its field names in order, "?" after those left out when empty.
struct EventSchema {
  std::string kind;
  std::vector<std::string> fields;
};

namespace journal_internal {

template <class T>
struct IsOptional : std::false_type {};
template <class T>
struct IsOptional<std::optional<T>> : std::true_type {};
template <class T>
struct IsVector : std::false_type {};
template <class T>
struct IsVector<std::vector<T>> : std::true_type {};

// Collects field names (for EventSchema and the docs check).
class FieldNames {
 public:
  template <class T>
  void operator()(const char* key, const T&) {
    names.push_back(std::string(key) + (IsOptional<T>::value ? "?" : ""));
  }
  std::vector<std::string> names;
};

template <class T>
concept HasFields = requires(T& t, FieldNames& f) {
  t.Fields(f);
};

class FieldWriter {
 public:
  explicit FieldWriter(nlohmann::ordered_json* j) : j_(j) {}
  template <class T>
  void operator()(const char* key, const T& v) {
    if constexpr (IsOptional<T>::value) {
      if (v) (*j_)[key] = Value(*v);
    } else {
      (*j_)[key] = Value(v);
    }
  }
  template <class T>
  static nlohmann::ordered_json Value(const T& v) {
    if constexpr (std::is_same_v<T, double>) {
      return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr);
    } else if constexpr (std::is_same_v<T, NullableString>) {
      return std::holds_alternative<std::string>(v)
                 ? nlohmann::ordered_json(std::get<std::string>(v))
                 : nlohmann::ordered_json(nullptr);
    } else if constexpr (std::is_same_v<T, nlohmann::json>) {
      return nlohmann::ordered_json(v);
    } else if constexpr (IsVector<T>::value) {
      nlohmann::ordered_json a = nlohmann::ordered_json::array();
      for (const auto& x : v) a.push_back(Value(x));
      return a;
    } else if constexpr (HasFields<T>) {
      nlohmann::ordered_json o = nlohmann::ordered_json::object();
      FieldWriter w(&o);
      const_cast<T&>(v).Fields(w);  // Fields only reads through a writer
      return o;
    } else {
      static_assert(
          std::is_same_v<T, int64_t> || std::is_same_v<T, bool> || std::is_same_v<T, std::string>,
          "a journal field is int64_t, double, bool, std::string, NullableString, "
          "nlohmann::json, a struct with Fields, or a vector or optional of them");
      return nlohmann::ordered_json(v);
    }
  }

 private:
  nlohmann::ordered_json* j_;
};

class FieldReader {
 public:
  explicit FieldReader(JsonValue obj) : obj_(obj) {}
  template <class T>
  void operator()(const char* key, T& v) {
    if constexpr (IsOptional<T>::value) {
      const JsonValue x = obj_.Optional(key);
      v.reset();
      if (x.present()) {
        typename T::value_type y{};
        Read(x, &y);
        v = std::move(y);
      }
    } else {
      Read(obj_[key], &v);
    }
  }
  template <class T>
  static void Read(const JsonValue& x, T* v) {
    if (!x.present()) return;  // a missing required field: the reader has its error already
    if constexpr (std::is_same_v<T, double>) {
      *v = x.Number();
    } else if constexpr (std::is_same_v<T, NullableString>) {
      if (x.is_null())
        *v = nullptr;
      else
        *v = x.Get<std::string>();
    } else if constexpr (std::is_same_v<T, nlohmann::json>) {
      *v = x.raw();
    } else if constexpr (IsVector<T>::value) {
      v->clear();
      for (const JsonValue& e : x.Items()) {
        typename T::value_type y{};
        Read(e, &y);
        v->push_back(std::move(y));
      }
    } else if constexpr (HasFields<T>) {
      FieldReader r(x);  // its first field records "must be an object" for anything else
      v->Fields(r);
    } else {
      *v = x.Get<T>();
    }
  }

 private:
  JsonValue obj_;
};

Status CheckKind(JsonReader* r, const std::string& kind, const std::vector<std::string>& kinds);

}  // namespace journal_internal

// The kind's line (see JournalEvent::ToJson).
template <class E>
nlohmann::ordered_json EventToJson(const E& e) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  j[kEventKey] = e.kind();
  journal_internal::FieldWriter w(&j);
  const_cast<E&>(e).Fields(w);
  return j;
}

// Reads `line` as an event of E's kind(s): Corruption naming `where` and the first field that is
// missing or of the wrong type. Keys E does not know are ignored (a newer keel's additions).
template <class E>
Status EventFromJson(const nlohmann::json& line, const std::string& where, E* out) {
  JsonReader r(where, line);
  const std::string kind = r.root()[kEventKey].template Get<std::string>();
  KEEL_RETURN_IF_ERROR(r.status());
  KEEL_RETURN_IF_ERROR(journal_internal::CheckKind(&r, kind, E::Kinds()));
  *out = E{};
  out->SetKind(kind);
  journal_internal::FieldReader f(r.root());
  out->Fields(f);
  return r.status();
}

// The documented shape of each kind of E (one per kind).
template <class E>
std::vector<EventSchema> EventSchemasOf() {
  E e;
  journal_internal::FieldNames names;
  e.Fields(names);
  std::vector<EventSchema> out;
  for (const std::string& k : E::Kinds()) out.push_back({k, names.names});
  return out;
}

// The members every single-kind event declares: its kind, ToJson and FromJson.
#define KEEL_JOURNAL_EVENT(TYPE, KIND)                                                      \
  static constexpr const char* kKind = KIND;                                                \
  static std::vector<std::string> Kinds() {                                                 \
    return {kKind};                                                                         \
  }                                                                                         \
  void SetKind(const std::string&) {}                                                       \
  std::string kind() const override {                                                       \
    return kKind;                                                                           \
  }                                                                                         \
  nlohmann::ordered_json ToJson() const override {                                          \
    return EventToJson(*this);                                                              \
  }                                                                                         \
  static Status FromJson(const nlohmann::json& line, const std::string& where, TYPE* out) { \
    return EventFromJson(line, where, out);                                                 \
  }

// The same for a type that serves two kinds of one shape ("straggler" and
// "straggler_recovered"): `FLAG` (a bool member) is true for the second.
#define KEEL_JOURNAL_EVENT_PAIR(TYPE, KIND, KIND_IF_FLAG, FLAG)                             \
  static std::vector<std::string> Kinds() {                                                 \
    return {KIND, KIND_IF_FLAG};                                                            \
  }                                                                                         \
  void SetKind(const std::string& k) {                                                      \
    FLAG = k == KIND_IF_FLAG;                                                               \
  }                                                                                         \
  std::string kind() const override {                                                       \
    return FLAG ? KIND_IF_FLAG : KIND;                                                      \
  }                                                                                         \
  nlohmann::ordered_json ToJson() const override {                                          \
    return EventToJson(*this);                                                              \
  }                                                                                         \
  static Status FromJson(const nlohmann::json& line, const std::string& where, TYPE* out) { \
    return EventFromJson(line, where, out);                                                 \
  }

// The fields a reader of every kind uses (keel report's markers), whatever the kind. Each may be
// absent; "event" not a string or "iteration" not an integer is an error; the others are shown
// only when they are strings.
struct JournalLineHeader {
  std::optional<std::string> event;
  std::optional<int64_t> iteration;
  std::optional<nlohmann::json> at, reason, signal;
  template <class F>
  void Fields(F& f) {
    f(kEventKey, event);
    f("iteration", iteration);
    f(kEventAtKey, at);
    f("reason", reason);
    f("signal", signal);
  }
  static Status FromJson(const nlohmann::json& line, const std::string& where,
                         JournalLineHeader* out);
};

}  // namespace keel

// What the tests of every journal's typed events share: a filler that gives each field of an event
// a value of its own, the round trip and refusal checks of one event type, and the kinds and
// fields docs/observability.md lists between <!-- journal-kinds: NAME --> and
// <!-- /journal-kinds -->.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "journal/journal_event.h"
#include "keel_test_paths.h"

namespace keel {

// Sets every field (optional ones too) to a distinct value of its type.
class SampleFiller {
 public:
  template <class T>
  void operator()(const char*, T& v) {
    Fill(&v);
  }
  template <class T>
  void Fill(T* v) {
    using journal_internal::HasFields;
    using journal_internal::IsOptional;
    using journal_internal::IsVector;
    if constexpr (IsOptional<T>::value) {
      typename T::value_type y{};
      Fill(&y);
      *v = std::move(y);
    } else if constexpr (std::is_same_v<T, double>) {
      *v = static_cast<double>(++n_) + 0.25;
    } else if constexpr (std::is_same_v<T, int64_t>) {
      *v = ++n_;
    } else if constexpr (std::is_same_v<T, bool>) {
      *v = true;
    } else if constexpr (std::is_same_v<T, std::string>) {
      *v = std::to_string(++n_);
      v->insert(v->begin(), 's');  // not "s" + ...: GCC 12's -Wrestrict misfires on that
    } else if constexpr (std::is_same_v<T, NullableString>) {
      std::string n = std::to_string(++n_);
      n.insert(n.begin(), 'n');
      *v = std::move(n);
    } else if constexpr (std::is_same_v<T, nlohmann::json>) {
      *v = ++n_;
    } else if constexpr (IsVector<T>::value) {
      v->resize(2);
      for (auto& x : *v) Fill(&x);
    } else {
      static_assert(HasFields<T>);
      v->Fields(*this);
    }
  }

 private:
  int64_t n_ = 0;
};

// Every kind of E: a filled event and a default one read back equal; a line without any one of
// its required fields, or of another kind, is refused naming the field.
template <class E>
void CheckEventType() {
  for (const std::string& kind : E::Kinds()) {
    SCOPED_TRACE(kind);
    E filled;
    filled.SetKind(kind);
    SampleFiller fill;
    filled.Fields(fill);
    E plain;
    plain.SetKind(kind);
    for (const E* e : {&filled, &plain}) {
      const nlohmann::json line = e->ToJson();
      EXPECT_EQ(line[kEventKey], kind);
      E back;
      const Status st = E::FromJson(line, "events.jsonl line 7", &back);
      ASSERT_TRUE(st.ok()) << st.message();
      EXPECT_EQ(back.kind(), kind);
      EXPECT_EQ(nlohmann::json(back.ToJson()).dump(), line.dump());
    }
    const nlohmann::json line = filled.ToJson();
    const std::vector<EventSchema> schemas = EventSchemasOf<E>();
    for (const std::string& field : schemas[0].fields) {
      if (field.back() == '?') {  // optional: its absence reads as none
        nlohmann::json without = line;
        without.erase(field.substr(0, field.size() - 1));
        E back;
        EXPECT_TRUE(E::FromJson(without, "events.jsonl line 7", &back).ok()) << field;
        continue;
      }
      nlohmann::json without = line;
      ASSERT_EQ(without.erase(field), 1u) << field;
      E back;
      const Status st = E::FromJson(without, "events.jsonl line 7", &back);
      EXPECT_FALSE(st.ok()) << field;
      EXPECT_NE(st.message().find("events.jsonl line 7: key '" + field + "' is missing"),
                std::string::npos)
          << st.message();
    }
    nlohmann::json other = line;
    other[kEventKey] = "no_such_kind";
    E back;
    const Status st = E::FromJson(other, "events.jsonl line 7", &back);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("key 'event' must be \"" + E::Kinds()[0]), std::string::npos)
        << st.message();
    EXPECT_FALSE(E::FromJson(nlohmann::json::array(), "events.jsonl line 7", &back).ok());
  }
}

// kind -> its fields, as docs/observability.md's table `name` lists them (backquoted names in
// the second column; "?" after those left out when empty).
inline std::map<std::string, std::vector<std::string>> DocumentedKinds(const std::string& name) {
  std::ifstream in(std::string(KEEL_SOURCE_DIR) + "/docs/observability.md");
  std::stringstream text;
  text << in.rdbuf();
  const std::string doc = text.str();
  const std::string open = "<!-- journal-kinds: " + name + " -->";
  const size_t begin = doc.find(open);
  const size_t end = doc.find("<!-- /journal-kinds -->", begin);
  std::map<std::string, std::vector<std::string>> kinds;
  if (begin == std::string::npos || end == std::string::npos) return kinds;
  std::istringstream rows(doc.substr(begin, end - begin));
  const std::regex tick("`([^`]*)`");
  for (std::string row; std::getline(rows, row);) {
    if (row.rfind("| `", 0) != 0) continue;
    std::vector<std::string> cells;
    std::stringstream cs(row.substr(1));
    for (std::string c; std::getline(cs, c, '|');) cells.push_back(c);
    if (cells.size() < 2) continue;
    std::smatch m;
    if (!std::regex_search(cells[0], m, tick)) continue;
    if (kinds.count(m[1])) {  // a kind listed twice: the check must see it
      kinds[m[1]].push_back("(listed twice)");
      continue;
    }
    std::vector<std::string>& fields = kinds[m[1]];
    for (auto it = std::sregex_iterator(cells[1].begin(), cells[1].end(), tick);
         it != std::sregex_iterator(); ++it)
      fields.push_back((*it)[1]);
  }
  return kinds;
}

// The table's rows as the types say they must be (to paste into the docs when a kind changes).
inline std::string ExpectedRows(const std::vector<EventSchema>& schemas) {
  std::string out;
  for (const EventSchema& s : schemas) {
    out += "| `" + s.kind + "` | ";
    for (size_t i = 0; i < s.fields.size(); ++i) out += (i ? ", `" : "`") + s.fields[i] + "`";
    out += " | ... |\n";
  }
  return out;
}

// docs/observability.md's table `name` lists exactly the kinds of `schemas`, with their fields.
inline void CheckDocumented(const std::string& name, const std::vector<EventSchema>& schemas) {
  const std::map<std::string, std::vector<std::string>> docs = DocumentedKinds(name);
  std::map<std::string, std::vector<std::string>> types;
  for (const EventSchema& s : schemas) {
    if (types.count(s.kind)) ADD_FAILURE() << "two types write kind " << s.kind;
    types[s.kind] = s.fields;
  }
  EXPECT_EQ(docs, types) << "docs/observability.md's table \"" << name
                         << "\" must list every kind and its fields as the types do:\n"
                         << ExpectedRows(schemas);
}

}  // namespace keel

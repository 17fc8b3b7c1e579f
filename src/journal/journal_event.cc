#include "journal/journal_event.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace keel {
namespace journal_internal {

Status CheckKind(JsonReader* r, const std::string& kind, const std::vector<std::string>& kinds) {
  for (const std::string& k : kinds)
    if (k == kind) return Status::OK();
  r->Fail(kEventKey,
          fmt::format("must be \"{}\", but is \"{}\"", fmt::join(kinds, "\" or \""), kind));
  return r->status();
}

}  // namespace journal_internal

Status JournalLineHeader::FromJson(const nlohmann::json& line, const std::string& where,
                                   JournalLineHeader* out) {
  JsonReader r(where, line);
  *out = JournalLineHeader{};
  journal_internal::FieldReader f(r.root());
  out->Fields(f);
  return r.status();
}

}  // namespace keel

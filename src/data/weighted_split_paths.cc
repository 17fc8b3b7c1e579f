#include "data/weighted_split_paths.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <sstream>

namespace keel {
namespace {

std::string Trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t\r\n") - a + 1);
}

// The whole of `s` as a finite number.
bool Number(const std::string& s, double* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  *out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size() && std::isfinite(*out);
}

}  // namespace

Status ParseWeightedSplitGroup(const std::string& text, const std::string& flag,
                               WeightedSplitGroup* out) {
  *out = WeightedSplitGroup();
  const std::string form =
      "expected \"NAME: WEIGHT START:END PREFIX, WEIGHT START:END PREFIX, ...\" with 0 <= START < "
      "END <= 1, e.g. \"train: 0.7 0:0.95 data/en, 0.3 0:0.95 data/fr\"";
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument(fmt::format("{} \"{}\": {}; {}", flag, text, why, form));
  };
  const size_t colon = text.find(':');
  if (colon == std::string::npos) return bad("no NAME: before the datasets");
  out->name = Trim(text.substr(0, colon));
  if (out->name.empty()) return bad("the group has no name");
  std::string rest = text.substr(colon + 1);
  double total = 0;
  size_t begin = 0;
  while (true) {
    const size_t comma = rest.find(',', begin);
    const std::string item = rest.substr(begin, comma == std::string::npos ? comma : comma - begin);
    std::istringstream words(item);
    std::vector<std::string> w;
    for (std::string x; words >> x;) w.push_back(x);
    if (w.size() != 3)
      return bad(fmt::format("dataset {} \"{}\" is not WEIGHT START:END PREFIX",
                             out->entries.size() + 1, Trim(item)));
    WeightedSplitEntry e;
    e.prefix = w[2];
    const size_t range_colon = w[1].find(':');
    if (!Number(w[0], &e.weight) || e.weight < 0)
      return bad(fmt::format("weight '{}' is not a non-negative number", w[0]));
    if (range_colon == std::string::npos || !Number(w[1].substr(0, range_colon), &e.start) ||
        !Number(w[1].substr(range_colon + 1), &e.end) ||
        !(e.start >= 0 && e.start < e.end && e.end <= 1))
      return bad(fmt::format("range '{}' of {} is not START:END with 0 <= START < END <= 1", w[1],
                             e.prefix));
    total += e.weight;
    out->entries.push_back(e);
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  if (!(total > 0)) return bad("every weight is 0");
  return Status::OK();
}

void DocumentRange(const WeightedSplitEntry& e, int64_t n, int64_t* first, int64_t* last) {
  // Python's round(): half to even, as nearbyint does in the default rounding mode.
  *first = static_cast<int64_t>(std::nearbyint(e.start * static_cast<double>(n)));
  *last = static_cast<int64_t>(std::nearbyint(e.end * static_cast<double>(n)));
}

}  // namespace keel

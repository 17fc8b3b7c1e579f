// Comparing the per-iteration records of two training runs (a layout against one rank, a run
// against itself): the largest difference, and bit-identity.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace keel_test {

inline double MaxDiff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

inline bool SameBits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

// The journal's decisions ("detected 480", "rollback 480": event and consumed samples) from the
// text of an events.jsonl, without the timing signals (throughput, goodput, stragglers), which a
// loaded machine may add to one run and not the other.
inline std::vector<std::string> GuardDecisionEvents(const std::string& events_jsonl) {
  std::vector<std::string> v;
  std::istringstream in(events_jsonl);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    const std::string e = j["event"];
    if (e.rfind("throughput_", 0) == 0 || e.rfind("goodput", 0) == 0 ||
        e.rfind("straggler", 0) == 0)
      continue;
    v.push_back(e + " " + j.value("consumed_samples", nlohmann::json()).dump());
  }
  return v;
}

}  // namespace keel_test

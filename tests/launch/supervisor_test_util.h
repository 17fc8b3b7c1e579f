// Helpers of the supervisor's in-process tests (supervisor_test.cc, supervisor_hosts_test.cc):
// each test's scratch directory, and what a run directory holds afterwards.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace keel::supervisor_test {

// The whole file ("" when it is missing).
inline std::string ReadText(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The records of `run`/events.jsonl whose "event" is `kind`, in order.
inline std::vector<nlohmann::json> Events(const std::string& run, const std::string& kind) {
  std::vector<nlohmann::json> out;
  std::istringstream in(ReadText(run + "/events.jsonl"));
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json e = nlohmann::json::parse(line);
    if (e.value("event", "") == kind) out.push_back(e);
  }
  return out;
}

// An empty directory for the running test, named by `prefix`, the process and the test (tests of
// several processes at once never share one).
inline std::string FreshTestDir(const std::string& prefix) {
  namespace fs = std::filesystem;
  const std::string dir = (fs::temp_directory_path() /
                           (prefix + "_" + std::to_string(getpid()) + "_" +
                            ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                              .string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

}  // namespace keel::supervisor_test

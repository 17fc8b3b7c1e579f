// Megatron-DeepSpeed's --{train,valid}-weighted-split-paths-path file (BLOOM's train-splits.txt):
// the file's line of quoted groups, each group's syntax, and the document ranges it selects.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "data/weighted_split_paths.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> groups;
  if (!keel::SplitWeightedSplitPathsFile(keel::fuzz::AsString(data, size), "splits.txt", &groups)
           .ok())
    return 0;
  for (const std::string& text : groups) {
    keel::WeightedSplitGroup g;
    if (!keel::ParseWeightedSplitGroup(text, "--train-weighted-split-paths", &g).ok()) continue;
    for (const keel::WeightedSplitEntry& e : g.entries)
      for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{1000}, int64_t{1} << 40}) {
        int64_t first = 0, last = 0;
        keel::DocumentRange(e, n, &first, &last);
        if (first < 0 || last > n || first > last) __builtin_trap();
      }
  }
  return 0;
}

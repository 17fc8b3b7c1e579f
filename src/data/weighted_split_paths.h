// Megatron-DeepSpeed's weighted split paths (--train-weighted-split-paths, --valid-...; BLOOM's
// train-splits.txt): a group "NAME: W1 START:END PREFIX1, W2 START:END PREFIX2" is a mixture of
// datasets by weight, each read over its documents [round(START x n), round(END x n)) of its n
// documents (Megatron's get_split_by_range_, round half to even). Training reads one group;
// each validation group is evaluated on its own.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace keel {

struct WeightedSplitEntry {
  double weight = 0;
  double start = 0, end = 1;  // fractions of the dataset's documents, 0 <= start < end <= 1
  std::string prefix;
};

struct WeightedSplitGroup {
  std::string name;
  std::vector<WeightedSplitEntry> entries;
};

// Parses one group; `flag` names it in errors (e.g. "--train-weighted-split-paths"). Weights are
// as given (not normalised), at least one positive.
Status ParseWeightedSplitGroup(const std::string& text, const std::string& flag,
                               WeightedSplitGroup* out);

// The documents [first, last) of `num_documents` that START:END selects.
void DocumentRange(const WeightedSplitEntry& e, int64_t num_documents, int64_t* first,
                   int64_t* last);

}  // namespace keel

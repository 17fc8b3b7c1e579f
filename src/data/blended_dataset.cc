#include "data/blended_dataset.h"

#include <charconv>
#include <cmath>

namespace keel {

Status BlendedDataset::Create(const std::vector<double>& weights, const std::string& what,
                              BlendedDataset* out) {
  if (weights.empty()) return Status::InvalidArgument(what + ": no datasets");
  double sum = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (!std::isfinite(weights[i]) || weights[i] < 0)
      return Status::InvalidArgument(what + ": weight " + std::to_string(weights[i]) +
                                     " of dataset " + std::to_string(i + 1) +
                                     " must be a finite number >= 0");
    sum += weights[i];
  }
  if (!(sum > 0))
    return Status::InvalidArgument(what +
                                   ": the weights sum to 0; give at least one dataset a "
                                   "positive weight");
  BlendedDataset b;
  for (double w : weights) b.weights_.push_back(w / sum);
  b.counts_.assign(weights.size(), 0);
  b.snapshots_.push_back(b.counts_);
  *out = std::move(b);
  return Status::OK();
}

int BlendedDataset::Pick(int64_t k, const std::vector<int64_t>& counts) const {
  int best = 0;
  double best_gap = -INFINITY;
  for (size_t d = 0; d < weights_.size(); ++d) {
    const double gap = weights_[d] * static_cast<double>(k + 1) - static_cast<double>(counts[d]);
    if (gap > best_gap) best_gap = gap, best = static_cast<int>(d);
  }
  return best;
}

void BlendedDataset::StepFrom(int64_t* k, std::vector<int64_t>* counts, int64_t to) const {
  while (*k < to) {
    ++(*counts)[static_cast<size_t>(Pick(*k, *counts))];
    ++*k;
  }
}

std::pair<int, int64_t> BlendedDataset::Locate(int64_t k) {
  if (k < cursor_ || k - cursor_ > kSnapshotEvery) {
    // Jump: extend the snapshots up to k's block, then start from the block's snapshot.
    const int64_t block = k / kSnapshotEvery;
    while (static_cast<int64_t>(snapshots_.size()) <= block) {
      int64_t at = (static_cast<int64_t>(snapshots_.size()) - 1) * kSnapshotEvery;
      std::vector<int64_t> c = snapshots_.back();
      StepFrom(&at, &c, at + kSnapshotEvery);
      snapshots_.push_back(std::move(c));
    }
    cursor_ = block * kSnapshotEvery;
    counts_ = snapshots_[static_cast<size_t>(block)];
  }
  StepFrom(&cursor_, &counts_, k);
  const int d = Pick(k, counts_);
  return {d, counts_[static_cast<size_t>(d)]};
}

Status ParseDataBlend(const std::vector<std::string>& items,
                      std::vector<std::pair<double, std::string>>* out) {
  out->clear();
  if (items.size() == 1) {
    out->emplace_back(1.0, items[0]);
    return Status::OK();
  }
  if (items.empty() || items.size() % 2 != 0)
    return Status::InvalidArgument(
        "--data-path takes one PREFIX, or WEIGHT PREFIX pairs (e.g. --data-path 0.7 cm4 0.3 pmd); "
        "got " +
        std::to_string(items.size()) + " values");
  for (size_t i = 0; i < items.size(); i += 2) {
    double w = 0;
    const std::string& t = items[i];
    auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), w);
    if (ec != std::errc() || p != t.data() + t.size() || !std::isfinite(w) || w < 0)
      return Status::InvalidArgument("--data-path: '" + t + "' (before '" + items[i + 1] +
                                     "') is not a weight >= 0; the syntax is WEIGHT PREFIX pairs, "
                                     "e.g. --data-path 0.7 cm4 0.3 pmd");
    out->emplace_back(w, items[i + 1]);
  }
  return Status::OK();
}

}  // namespace keel

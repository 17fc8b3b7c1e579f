// BlendedDataset: several datasets mixed by weights, in a deterministic sequence.
//
// Position k of the blend reads dataset d(k), sample c_d(k) of it (its own shuffled order, its own
// epochs), where c_d(k) counts the earlier positions given to d. d(k) is chosen by error
// diffusion: the dataset whose count is furthest below its share, d(k) = argmax_d (w_d (k+1) -
// c_d(k)), ties to the lowest index. So over any window of N consecutive positions each dataset
// gets w_d N samples within a bound of about one sample per dataset (tested: |count - w_d N| < 2
// for two and three datasets), and the sequence of (dataset, sample) is a pure function of the
// weights and k: a resumed run continues it exactly. Unlike Megatron's blending index (an array
// as long as the training run), memory is a snapshot of the counts every 4096 positions; reading
// positions in order costs O(#datasets) each, a jump at most 4096 steps of O(#datasets).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace keel {

class BlendedDataset {
 public:
  // `weights` (one per dataset) must be finite, >= 0, with a positive sum; they are normalised.
  // `what` names them in errors (e.g. "--data-path").
  static Status Create(const std::vector<double>& weights, const std::string& what,
                       BlendedDataset* out);

  // The dataset and the sample within it of position k.
  std::pair<int, int64_t> Locate(int64_t k);
  const std::vector<double>& weights() const { return weights_; }

 private:
  void StepFrom(int64_t* k, std::vector<int64_t>* counts, int64_t to) const;
  int Pick(int64_t k, const std::vector<int64_t>& counts) const;

  static constexpr int64_t kSnapshotEvery = 4096;
  std::vector<double> weights_;
  std::vector<std::vector<int64_t>> snapshots_;  // counts at positions 0, 4096, 8192, ...
  int64_t cursor_ = 0;                           // counts_ are those before position cursor_
  std::vector<int64_t> counts_;
};

// Parses Megatron's weighted --data-path: "PREFIX" alone, or "W1 PREFIX1 W2 PREFIX2 ...".
Status ParseDataBlend(const std::vector<std::string>& items,
                      std::vector<std::pair<double, std::string>>* out);

}  // namespace keel

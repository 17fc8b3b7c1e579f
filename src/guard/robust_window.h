// RobustWindow: the last N finite values of one signal, with their median and median absolute
// deviation. Non-finite values are refused at the door, so a NaN can never poison the statistics
// (a mean/std window that takes one NaN reports NaN for the next N steps).
#pragma once

#include <cstddef>
#include <deque>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"

namespace keel {

// Median of v (mean of the two middle values for an even count); NaN when empty.
double MedianOf(std::vector<double> v);
// The lower median: the element at index (n - 1) / 2 of the sorted values (for an even count the
// lower of the two middle ones, never their mean); NaN when empty.
double LowerMedianOf(std::vector<double> v);

class RobustWindow {
 public:
  explicit RobustWindow(size_t capacity = 100) : capacity_(capacity) {}

  // Adds `v` when finite (dropping the oldest value once full); returns false for NaN/Inf.
  bool Add(double v);
  void Clear() { values_.clear(); }
  size_t size() const { return values_.size(); }
  size_t capacity() const { return capacity_; }
  double Median() const;  // NaN when empty
  double Mad() const;     // median of |x - median|; NaN when empty
  // Median of the newest k values (the level now, following a trend with a lag of ~k/2).
  double RecentMedian(size_t k) const;
  // The noise level without the trend: 1.4826 * MAD of consecutive differences / sqrt(2) (a
  // falling loss inflates the plain MAD; its differences do not care). NaN below 3 values.
  double NoiseScale() const;
  // Robust z-score of v: (v - RecentMedian(recent)) / max(NoiseScale, rel_floor * |median|,
  // abs_floor). The floors keep a flat window (noise ~ 0) from turning noise into huge scores.
  double Z(double v, double rel_floor, double abs_floor, size_t recent = 20) const;

  nlohmann::json ToJson() const;  // {"capacity": N, "values": [...]} (values as doubles)
  Status FromJson(const nlohmann::json& j, const std::string& where);

 private:
  size_t capacity_;
  std::deque<double> values_;  // oldest first
};

}  // namespace keel

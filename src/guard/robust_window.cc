#include "guard/robust_window.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "core/json_reader.h"

namespace keel {

double MedianOf(std::vector<double> v) {
  if (v.empty()) return NAN;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  const double hi = v[mid];
  if (v.size() % 2 == 1) return hi;
  const double lo = *std::max_element(v.begin(), v.begin() + mid);
  return 0.5 * (lo + hi);
}

double LowerMedianOf(std::vector<double> v) {
  if (v.empty()) return NAN;
  const auto lower = v.begin() + static_cast<ptrdiff_t>((v.size() - 1) / 2);
  std::nth_element(v.begin(), lower, v.end());
  return *lower;
}

bool RobustWindow::Add(double v) {
  if (!std::isfinite(v)) return false;
  values_.push_back(v);
  while (values_.size() > capacity_) values_.pop_front();
  return true;
}

double RobustWindow::Median() const {
  return MedianOf(std::vector<double>(values_.begin(), values_.end()));
}

double RobustWindow::Mad() const {
  const double m = Median();
  std::vector<double> dev;
  dev.reserve(values_.size());
  for (double v : values_) dev.push_back(std::fabs(v - m));
  return MedianOf(std::move(dev));
}

double RobustWindow::RecentMedian(size_t k) const {
  k = std::min(k, values_.size());
  return MedianOf(
      std::vector<double>(values_.end() - static_cast<std::ptrdiff_t>(k), values_.end()));
}

double RobustWindow::NoiseScale() const {
  if (values_.size() < 3) return NAN;
  std::vector<double> d;
  d.reserve(values_.size() - 1);
  for (size_t i = 1; i < values_.size(); ++i) d.push_back(values_[i] - values_[i - 1]);
  const double m = MedianOf(d);
  for (double& x : d) x = std::fabs(x - m);
  return 1.4826 * MedianOf(std::move(d)) / std::sqrt(2.0);
}

double RobustWindow::Z(double v, double rel_floor, double abs_floor, size_t recent) const {
  if (values_.empty() || !std::isfinite(v)) return NAN;
  const double m = RecentMedian(recent);
  const double noise = NoiseScale();
  const double scale =
      std::max({std::isfinite(noise) ? noise : 0.0, rel_floor * std::fabs(m), abs_floor});
  return (v - m) / scale;
}

nlohmann::json RobustWindow::ToJson() const {
  return {{"capacity", capacity_}, {"values", std::vector<double>(values_.begin(), values_.end())}};
}

Status RobustWindow::FromJson(const nlohmann::json& j, const std::string& where) {
  JsonReader r(where, j);
  const size_t cap = r.root()["capacity"].Get<size_t>();
  std::deque<double> vals;
  for (const JsonValue& v : r.root()["values"].Items()) {
    const double d = v.Get<double>();
    if (r.ok() && !std::isfinite(d)) r.Fail(v.path(), "is not finite");
    vals.push_back(d);
  }
  KEEL_RETURN_IF_ERROR(r.status());
  if (cap == 0 || vals.size() > cap)
    return Status::Corruption(where + ": window holds more values than its capacity");
  capacity_ = cap;
  values_ = std::move(vals);
  return Status::OK();
}

}  // namespace keel

#include "guard/loss_trend_detector.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/json_number.h"
#include "core/json_reader.h"
#include "guard/robust_window.h"

namespace keel {
namespace {

constexpr int kBlocks = 8;
constexpr double kFlatZ = 3.25;       // z of the rise above the level just before s (not carried)
constexpr double kStepMargin = 10;    // squared noise units a step must fit better than the ramp
constexpr int64_t kFlatWindow = 200;  // iterations before s whose plain mean the flat test uses
constexpr double kClip = 3;           // winsorizing bound, in noise units
constexpr double kClipVar = 0.9707;   // E[min(x, 3)^2] of a standard normal |x|

double Median(std::vector<double> v) {
  return MedianOf(std::move(v));
}

// Whether r[from..] still climbs: its least-squares slope over dt is more than 2 standard errors
// (of noise `sigma`) above zero.
bool RisesAfter(const std::vector<double>& r, const std::vector<double>& dt, size_t from,
                double sigma) {
  const size_t n = r.size() - from;
  if (n < 3) return false;
  double mt = 0, mr = 0;
  for (size_t i = from; i < r.size(); ++i) mt += dt[i], mr += r[i];
  mt /= static_cast<double>(n), mr /= static_cast<double>(n);
  double sxx = 0, sxy = 0;
  for (size_t i = from; i < r.size(); ++i)
    sxx += (dt[i] - mt) * (dt[i] - mt), sxy += (dt[i] - mt) * (r[i] - mr);
  return sxx > 0 && sxy / sxx > 2 * sigma / std::sqrt(sxx);
}

}  // namespace

LossTrendDetector::LossTrendDetector(const LossTrendConfig& cfg) : cfg_(cfg) {}

LossTrendDetector::Fit LossTrendDetector::FitAt(int64_t s) const {
  Fit f;
  f.s = s;
  std::vector<const Point*> ref;
  for (const Point& p : points_)
    if (p.it >= s - cfg_.reference && p.it < s) ref.push_back(&p);
  const size_t n = ref.size();
  // The reference must cover most of its span: a history that begins just before s says little
  // about where the loss was going.
  if (n < static_cast<size_t>(2 * cfg_.min_records) || ref.front()->it > s - cfg_.reference / 2)
    return f;
  const size_t blocks = std::min<size_t>(kBlocks, n / 2);
  std::vector<double> bt(blocks), by(blocks);
  for (size_t b = 0; b < blocks; ++b) {
    std::vector<double> t, y;
    for (size_t i = b * n / blocks; i < (b + 1) * n / blocks; ++i) {
      t.push_back(static_cast<double>(ref[i]->it));
      y.push_back(ref[i]->y);
    }
    bt[b] = Median(std::move(t));
    by[b] = Median(std::move(y));
  }
  // The noise: consecutive differences, their MAD first, then their winsorized RMS (the MAD alone
  // is noisy on 100 records, and an underestimate inflates every z).
  std::vector<double> diffs;
  for (size_t i = 1; i < n; ++i) diffs.push_back(ref[i]->y - ref[i - 1]->y);
  const double dm = Median(diffs);
  std::vector<double> dev;
  for (double d : diffs) dev.push_back(std::fabs(d - dm));
  const double mad = std::max(1.4826 * Median(dev), 1e-6 * std::sqrt(2.0));
  double ss = 0;
  for (double d : dev) ss += std::min(d, kClip * mad) * std::min(d, kClip * mad);
  f.noise = std::max(std::sqrt(ss / static_cast<double>(dev.size()) / kClipVar / 2), 1e-6);
  // Theil-Sen over the block medians of the whole reference, and its standard error (the block
  // medians' noise over the spread of their times). Noise alone gives a slope of about one
  // standard error: the slope used is shrunk toward 0 by one, and never rising.
  const double block_se =
      1.25 * f.noise / std::sqrt(static_cast<double>(n) / static_cast<double>(blocks));
  // Of blocks [from, blocks): the slope shrunk by one standard error, never rising; and that error.
  auto theil_sen = [&](size_t from, double* se) {
    std::vector<double> slopes;
    double mt = 0, stt = 0;
    for (size_t i = from; i < blocks; ++i) mt += bt[i] / static_cast<double>(blocks - from);
    for (size_t i = from; i < blocks; ++i) {
      stt += (bt[i] - mt) * (bt[i] - mt);
      for (size_t j = i + 1; j < blocks; ++j)
        if (bt[j] > bt[i]) slopes.push_back((by[j] - by[i]) / (bt[j] - bt[i]));
    }
    if (slopes.empty() || stt <= 0) return static_cast<double>(NAN);
    *se = 1.1 * block_se / std::sqrt(stt);
    return std::min(0.0, Median(std::move(slopes)) + *se);
  };
  double se_all = 0;
  const double fitted = theil_sen(0, &se_all);
  // The level is carried at the newer half's slope: a healthy loss falls ever more slowly, and the
  // whole reference's slope would carry it too low early in a run.
  const double recent = theil_sen(blocks / 2, &f.slope_se);
  if (!std::isfinite(fitted) || !std::isfinite(recent)) return f;
  f.slope = fitted * cfg_.slope_damping;
  // The level at s: the winsorized mean of the newest `window` iterations of the reference,
  // carried to s at `slope`; its error counts the slope's over the mean distance carried.
  auto level_of = [&](int64_t window, double slope, double* level, double* se) {
    std::vector<double> v;
    for (size_t i = 0; i < n; ++i)
      if (ref[i]->it >= s - window)
        v.push_back(ref[i]->y + slope * static_cast<double>(s - ref[i]->it));
    if (v.size() < static_cast<size_t>(cfg_.min_records)) {
      v.clear();
      for (size_t i = n - static_cast<size_t>(cfg_.min_records); i < n; ++i)
        v.push_back(ref[i]->y + slope * static_cast<double>(s - ref[i]->it));
    }
    const double m = Median(v);
    double sum = 0;
    for (double x : v) sum += std::clamp(x, m - kClip * f.noise, m + kClip * f.noise);
    *level = sum / static_cast<double>(v.size());
    double carried = 0;  // the mean distance carried: the slope's error there adds to the level's
    for (size_t i = n - v.size(); i < n; ++i) carried += static_cast<double>(s - ref[i]->it);
    carried *= slope != 0 ? 1.0 / static_cast<double>(v.size()) : 0.0;
    *se =
        std::hypot(1.05 * f.noise / std::sqrt(static_cast<double>(v.size())), f.slope_se * carried);
  };
  // Carried undamped: damping would put the level above the curve and cost a falling loss's
  // divergence much of its evidence. A plateau that began inside the
  // reference is judged against the flat level of the last kFlatWindow iterations instead.
  level_of(cfg_.level_window, recent, &f.level, &f.level_se);
  level_of(kFlatWindow, 0.0, &f.flat_level, &f.flat_se);
  f.ok = true;
  return f;
}

bool LossTrendDetector::Add(int64_t iteration, double loss) {
  if (!std::isfinite(loss) || loss <= 0) return false;
  if (iteration <= ignore_until_) return false;
  if (!points_.empty() && iteration <= points_.back().it)
    Restart(iteration - 1), ignore_until_ = -1;
  points_.push_back({iteration, std::log(loss)});
  const int64_t keep = cfg_.reference + cfg_.max_window + cfg_.grid;
  while (points_.front().it < iteration - keep) points_.pop_front();
  cur_.latest = iteration;
  if (cur_.diverging) {
    // It lasts while the newest values (those of the last min_window iterations, at least
    // min_records) stay above the base.
    std::vector<double> recent;
    for (size_t i = points_.size(); i-- > 0;) {
      if (points_[i].it <= iteration - cfg_.min_window &&
          recent.size() >= static_cast<size_t>(cfg_.min_records))
        break;
      recent.push_back(points_[i].y);
    }
    const double level = Median(std::move(recent));
    if (level < std::log(cur_.base)) {
      cur_.diverging = false;
    } else {
      cur_.size = std::max(cur_.size, std::expm1(level - std::log(cur_.base)));
    }
    return false;
  }
  const bool before = cur_.diverging;
  Judge();
  return cur_.diverging && !before;
}

void LossTrendDetector::Judge() {
  const int64_t now = points_.back().it;
  const int64_t grid = std::max<int64_t>(cfg_.grid, 1);
  auto floor_grid = [&](int64_t v) { return (v >= 0 ? v : v - grid + 1) / grid * grid; };
  const int64_t lo = floor_grid(now - cfg_.max_window + grid - 1);
  const int64_t hi = floor_grid(now - cfg_.min_window);
  while (!fits_.empty() && fits_.front().s < lo) fits_.pop_front();
  for (int64_t s = fits_.empty() ? lo : fits_.back().s + grid; s <= hi; s += grid)
    fits_.push_back(FitAt(s));
  if (fits_.empty()) return;

  // Sums over the values at or after each candidate start, newest first, in u = t - now.
  double a0 = 0, a1 = 0, a2 = 0, b0 = 0, b1 = 0;
  size_t next = points_.size();  // points_[next..] are summed
  struct Best {
    double z = -1, b = 0;
    const Fit* fit = nullptr;
    size_t first = 0;
  } best;
  int candidates = 0;
  for (auto it = fits_.rbegin(); it != fits_.rend(); ++it) {
    const Fit& f = *it;
    while (next > 0 && points_[next - 1].it >= f.s) {
      --next;
      const double u = static_cast<double>(points_[next].it - now), y = points_[next].y;
      a0 += 1, a1 += u, a2 += u * u, b0 += y, b1 += y * u;
    }
    if (!f.ok || a0 < cfg_.min_records) continue;
    ++candidates;
    const double d = static_cast<double>(now - f.s);
    const double st = a1 + a0 * d, stt = a2 + 2 * d * a1 + a0 * d * d, syt = b1 + d * b0;
    if (stt <= 0) continue;
    // Two tests of a ramp from s: above the expected curve (the level at s, falling on at the
    // damped slope of the reference), which has the power; and above the level at s itself, which
    // a plateau (short of the curve, but not rising) does not pass.
    const double se = std::sqrt(f.noise * f.noise * stt + f.level_se * f.level_se * st * st);
    const double srt = syt - f.level * st, srt_exp = srt - f.slope * stt;
    const double z = srt_exp / se, b = srt / stt;
    const double se_flat = std::sqrt(f.noise * f.noise * stt + f.flat_se * f.flat_se * st * st);
    const double z_flat = (syt - f.flat_level * st) / se_flat;
    if (b * d < std::log1p(cfg_.min_abs_rise) || z_flat < kFlatZ) continue;
    if (z > best.z) best = {z, b, &f, next};
  }
  if (best.fit == nullptr || best.z < 3) return;
  // Denser records mean more looks at the same noise: the threshold rises with the records per
  // `grid` iterations (1 a record every 10 iterations: z_threshold; 10: +1.66).
  const double per_grid =
      static_cast<double>(points_.size() - 1) * static_cast<double>(grid) /
      std::max<double>(1.0, static_cast<double>(points_.back().it - points_.front().it));
  const double threshold = cfg_.z_threshold + 0.5 * std::log2(std::max(1.0, per_grid));
  const Fit& f = *best.fit;
  const size_t first = best.first, n = points_.size() - first;
  // A drift, not a step: a ramp from s must fit the values after s as well as a step to a new
  // level at the best moment does (a bump after an LR step or a batch ramp-up step, absorbed or
  // not, is the spike detector's, or the level rule's).
  std::vector<double> r(n), dt(n);
  double sse_ramp = 0, total = 0;
  for (size_t i = 0; i < n; ++i) {
    dt[i] = static_cast<double>(points_[first + i].it - f.s);
    r[i] = points_[first + i].y - f.level;
    sse_ramp += (r[i] - best.b * dt[i]) * (r[i] - best.b * dt[i]);
    total += r[i];
  }
  double sse_step = INFINITY, tail = total, before2 = 0, tail2 = 0;
  size_t step_at = 0;
  for (size_t i = 0; i < n; ++i) tail2 += r[i] * r[i];
  for (size_t k = 0; k < n; ++k) {  // the step at value k: 0 before, the tail's mean from there
    const double m = tail / static_cast<double>(n - k);
    if (before2 + tail2 - m * tail < sse_step) sse_step = before2 + tail2 - m * tail, step_at = k;
    before2 += r[k] * r[k];
    tail2 -= r[k] * r[k];
    tail -= r[k];
  }
  // By more than noise explains (a step has one parameter more, and chance favours it a little),
  // and flat after it: a loss that jumped and goes on climbing (an LR raised in steps) drifts.
  if (sse_ramp - sse_step > kStepMargin * f.noise * f.noise && !RisesAfter(r, dt, step_at, f.noise))
    return;
  // Still up now: the newest quarter of the window holds at least half the ramp's rise there.
  const size_t k = std::max<size_t>(3, n / 4);
  double recent = 0, ramp = 0;
  for (size_t i = n - k; i < n; ++i) recent += r[i], ramp += best.b * dt[i];
  if (recent < 0.5 * ramp) return;
  max_z_ = std::max(max_z_, best.z);
  if (best.z < threshold) return;
  const double d = static_cast<double>(now - f.s);
  cur_.diverging = true;
  cur_.start = f.s;
  cur_.found = now;
  cur_.base = std::exp(f.level);
  cur_.size = std::expm1(best.b * d);
  cur_.above_expected = std::expm1((best.b - f.slope) * d);
  cur_.z = best.z;
  const double p = 0.5 * std::erfc(best.z / std::sqrt(2.0));
  cur_.confidence = std::clamp(1.0 - p * candidates, 0.0, 1.0);
}

void LossTrendDetector::Restart(int64_t iteration) {
  while (!points_.empty() && points_.back().it > iteration) points_.pop_back();
  fits_.clear();
  cur_ = LossTrend();
  // A log of one record per 10 iterations carries a resume's bump for as many records as one of
  // a record per iteration: 20 iterations would be 2 of its records. The spacing is the smallest
  // of the last gaps (values judged abnormal, a spike's, leave larger ones).
  int64_t spacing = 0;
  for (size_t i = points_.size(); i-- > 1 && i + 8 > points_.size();) {
    const int64_t gap = points_[i].it - points_[i - 1].it;
    if (gap > 0 && (spacing == 0 || gap < spacing)) spacing = gap;
  }
  spacing = std::max<int64_t>(spacing, 1);
  ignore_until_ = iteration + std::max(cfg_.settle, cfg_.settle_records * spacing);
}

void LossTrendDetector::Rebaseline() {
  points_.clear();
  fits_.clear();
  cur_ = LossTrend();
  ignore_until_ = -1;
}

nlohmann::json LossTrendDetector::ToJson() const {
  nlohmann::json its = nlohmann::json::array(), ys = nlohmann::json::array();
  for (const Point& p : points_) its.push_back(p.it), ys.push_back(JsonNumber(p.y));
  nlohmann::json j = {{"iterations", its},
                      {"log_loss", ys},
                      {"ignore_until", ignore_until_},
                      {"diverging", cur_.diverging}};
  if (cur_.diverging) {
    j["start"] = cur_.start;
    j["found"] = cur_.found;
    j["base"] = JsonNumber(cur_.base);
    j["size"] = JsonNumber(cur_.size);
  }
  return j;
}

Status LossTrendDetector::FromJson(const nlohmann::json& j, const std::string& where) {
  points_.clear();
  fits_.clear();
  cur_ = LossTrend();
  if (!j.is_object()) return Status::Corruption(where + ": loss trend state is not an object");
  JsonReader r(where, j);
  const auto its = r.root().Optional("iterations").Items();
  const auto ys = r.root().Optional("log_loss").Items();
  ignore_until_ = r.root().Optional("ignore_until").Get<int64_t>(-1);
  cur_.diverging = r.root().Optional("diverging").Get<bool>(false);
  cur_.start = r.root().Optional("start").Get<int64_t>(0);
  cur_.found = r.root().Optional("found").Get<int64_t>(0);
  cur_.base = r.root().Optional("base").Number(0);
  cur_.size = r.root().Optional("size").Number(0);
  if (its.size() != ys.size()) r.Fail("log_loss", "must have as many values as iterations");
  for (size_t i = 0; i < its.size() && r.ok(); ++i) {
    const int64_t it = its[i].Get<int64_t>();
    const double y = ys[i].Number();
    if (!std::isfinite(y) || (!points_.empty() && it <= points_.back().it))
      r.Fail("iterations", "must be increasing, with finite values");
    points_.push_back({it, y});
  }
  if (!r.ok()) points_.clear(), cur_ = LossTrend();
  return r.status();
}

}  // namespace keel

// `keel bench level-shift`: how soon the live throughput-drop detector (the one `keel logs analyze`
// and `watch` run too) finds a sustained slowdown, against the slowdown's size and the noise, and
// how often it cries wolf on healthy series. Synthetic iteration times: 1 s times a Gaussian
// factor of relative standard deviation `noise`, 1% of iterations 30% slower (a log flush, a page
// fault), and from iteration K on every iteration `size` slower, for 3000 iterations (a return
// reported in them is false); the detector is fed 1 / time.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <vector>

#include "cli/commands.h"
#include "cli/usage_exit.h"
#include "core/log.h"
#include "core/rng.h"
#include "guard/robust_window.h"
#include "health/throughput_drop_detector.h"

namespace keel::cli {
namespace {

constexpr int64_t kShiftAt = 1500;  // K: the healthy iterations before the slowdown

double IterationTime(uint64_t seed, int64_t it, double noise, double size) {
  const RngKey key{seed, RngPurpose::kTest, 0}, outlier{seed, RngPurpose::kTest, 1};
  double t = 1.0 + noise * NormalAt(key, static_cast<uint64_t>(it));
  if (UniformAt(outlier, static_cast<uint64_t>(it)) < 0.01) t *= 1.3;
  return it >= kShiftAt ? t * (1 + size) : t;
}

struct Run {
  int64_t found = -1;  // the iteration the drop was decided at (-1: not within the run)
  int false_drops = 0;
  int false_returns = 0;  // recoveries of a slowdown that lasts
  double z = NAN, noise = NAN;
};

// One series of `iterations`, slowed by `size` from K (0: healthy).
Run Simulate(uint64_t seed, double noise, double size, int64_t iterations) {
  ThroughputDropDetector d(1, {});
  Run r;
  for (int64_t it = 1; it <= iterations; ++it) {
    const auto e = d.Add(it, 1.0 / IterationTime(seed, it, noise, size));
    if (!e) continue;
    if (!e->dropped) {
      r.false_returns += r.found >= 0;
      continue;
    }
    if (size <= 0 || it < kShiftAt) {
      ++r.false_drops;
      continue;
    }
    if (r.found >= 0) continue;  // again, after a false return
    r.found = it;
    r.z = e->z;
    r.noise = e->noise;
  }
  return r;
}

std::string Percent(double v) {
  return fmt::format("{:g}%", 100 * v);
}

}  // namespace

int BenchLevelShift(int argc, const char* const* argv) {
  CLI::App app(
      "Delay of the throughput-drop detector against a sustained slowdown's size and the noise, "
      "and its false drops on healthy series",
      "keel bench level-shift");
  bool quick = false;
  int seeds = 20;
  int64_t healthy_iters = 10000;
  app.add_flag("--quick", quick, "4 seeds and 3000-iteration healthy series (for tests)");
  app.add_option("--seeds", seeds, "series per cell (default 20)")->check(CLI::Range(1, 1000));
  app.add_option("--healthy-iterations", healthy_iters,
                 "iterations of each healthy series (default 10000)")
      ->check(CLI::Range(int64_t{1000}, int64_t{10000000}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return UsageExit(app, e);
  }
  if (quick) {
    if (app.get_option("--seeds")->count() == 0) seeds = 4;
    if (app.get_option("--healthy-iterations")->count() == 0) healthy_iters = 3000;
  }
  const ThroughputDropOptions o;
  const std::vector<double> sizes = {0.02, 0.03, 0.05, 0.10}, noises = {0.003, 0.005, 0.01, 0.02};
  Log("level shift: the live detector's defaults (threshold {}, window {}; sustained shifts from "
      "{} at z >= {:g}, windows {}..{}); iteration time 1 s x (1 + noise x N(0,1)), 1% of "
      "iterations 30% slower; slowdown from iteration {}; {} series per cell",
      Percent(o.threshold), o.window, Percent(o.shift.min_shift), o.shift.z, o.shift.min_window,
      o.shift.max_window, kShiftAt, seeds);
  Log("{:>6} {:>6} {:>9} {:>13} {:>10} {:>9} {:>11} {:>14}", "size", "noise", "found",
      "median delay", "max delay", "median z", "noise seen", "false returns");
  int missed = 0, early = 0, returns = 0;
  for (double size : sizes) {
    for (double noise : noises) {
      std::vector<double> delays, zs, seen;
      int cell_returns = 0;
      for (int s = 1; s <= seeds; ++s) {
        const Run r = Simulate(static_cast<uint64_t>(s), noise, size, kShiftAt + 3000);
        early += r.false_drops;
        cell_returns += r.false_returns;
        if (r.found < 0) continue;
        delays.push_back(static_cast<double>(r.found - kShiftAt));
        zs.push_back(r.z);
        seen.push_back(r.noise);
      }
      missed += seeds - static_cast<int>(delays.size());
      returns += cell_returns;
      const bool any = !delays.empty();
      Log("{:>6} {:>6} {:>9} {:>13} {:>10} {:>9} {:>11} {:>14}", Percent(size), Percent(noise),
          fmt::format("{}/{}", delays.size(), seeds),
          any ? fmt::format("{:g}", MedianOf(delays)) : "-",
          any ? fmt::format("{:g}", *std::max_element(delays.begin(), delays.end())) : "-",
          any ? fmt::format("{:.1f}", MedianOf(zs)) : "-",
          any ? fmt::format("{:.2f}%", 100 * MedianOf(seen)) : "-", cell_returns);
    }
  }
  Log("false drops on healthy series ({} iterations each, {} series per noise):", healthy_iters,
      seeds);
  Log("{:>6} {:>12} {:>17}", "noise", "false drops", "series with one");
  int64_t false_total = 0;
  for (double noise : noises) {
    int drops = 0, series = 0;
    for (int s = 1; s <= seeds; ++s) {
      const Run r = Simulate(static_cast<uint64_t>(1000 + s), noise, 0, healthy_iters);
      drops += r.false_drops;
      series += r.false_drops > 0;
    }
    false_total += drops;
    Log("{:>6} {:>12} {:>17}", Percent(noise), drops, series);
  }
  Log("missed slowdowns: {}; false drops before a slowdown: {}; false returns of a slowdown (in "
      "the 3000 iterations after it began): {}; false drops on healthy series: {}",
      missed, early, returns, false_total);
  return 0;
}

}  // namespace keel::cli

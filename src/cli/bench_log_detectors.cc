// `keel bench log-detectors`: how soon `keel logs analyze` reports a slow divergence and a small
// sustained slowdown, and how often it reports one on healthy logs. Synthetic logs
// (logs/synthetic_log.h) of both styles, 1 or 10 iterations a record, 0.3-1% noise, are generated
// in memory and go through the analyzer's own code (ParseMegatronLog, AnalyzeLog with the
// defaults of `keel logs analyze`); the delay is the iteration of the record that found the event
// minus the iteration the effect began.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/usage_exit.h"
#include "core/log.h"
#include "logs/log_analysis.h"
#include "logs/synthetic_log.h"

namespace keel::cli {
namespace {

constexpr int64_t kEffectStart = 6000;  // where the divergence or the slowdown begins
constexpr int64_t kEffectLogIterations = 7500;
constexpr int64_t kHealthyIterations = 10000;

struct Effect {
  std::string name;
  const char* kind;  // the analyzer's event kind that reports it
  double divergence = 0, slowdown = 0;
};

// The events of the analysis of `o`'s log (an empty list with an error when it fails).
std::vector<LogEvent> Analyze(const SyntheticLogOptions& o) {
  ParsedLog log;
  LogAnalysis a;
  if (!ParseMegatronLog(GenerateSyntheticLog(o), "synthetic.log", &log).ok() ||
      !AnalyzeLog(log, LogAnalysisOptions(), &a).ok())
    return {};
  return a.events;
}

bool IsFinding(const LogEvent& e) {
  return e.kind == "divergence" || e.kind == "throughput_drop";
}

}  // namespace

int BenchLogDetectors(int argc, const char* const* argv) {
  CLI::App app(
      "How soon `keel logs analyze` reports a slow divergence (+5% over 500 iterations) and a "
      "2-3% slowdown on synthetic Megatron-LM and Megatron-DeepSpeed logs, and its false reports "
      "on healthy logs",
      "keel bench log-detectors");
  int seeds = 5, healthy = 20;
  bool quick = false;
  app.add_option("--seeds", seeds, "logs per effect, style, iterations per record and noise")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  app.add_option("--healthy", healthy,
                 "healthy logs of 10k iterations per style, iterations per record and noise")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  app.add_flag("--quick", quick, "1 seed, 2 healthy logs, 1% noise only (for tests)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return UsageExit(app, e);
  }
  std::vector<double> noises = {0.003, 0.005, 0.01};
  if (quick) seeds = 1, healthy = std::min(healthy, 2), noises = {0.01};
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<Effect> effects = {{"divergence +5%/500 it", "divergence", 0.05, 0},
                                       {"slowdown 2%", "throughput_drop", 0, 0.02},
                                       {"slowdown 3%", "throughput_drop", 0, 0.03}};
  const SyntheticLogStyle styles[] = {SyntheticLogStyle::kMegatronLM,
                                      SyntheticLogStyle::kMegatronDeepSpeed};
  Log("keel bench log-detectors: the effect begins at iteration {} of {}; delay = the iteration "
      "of the record that found it - {}; {} log(s) per row",
      kEffectStart, kEffectLogIterations, kEffectStart, seeds);
  Log("{:<22} {:<19} {:>6} {:>6} {:>9} {:>12} {:>9} {:>6}", "effect", "style", "it/rec", "noise",
      "found", "delay med", "delay max", "false");
  bool divergence_ok = true;
  for (const Effect& e : effects) {
    for (SyntheticLogStyle style : styles) {
      for (int per : {1, 10}) {
        for (double noise : noises) {
          std::vector<int64_t> delays;
          int false_reports = 0;
          for (int seed = 1; seed <= seeds; ++seed) {
            SyntheticLogOptions o;
            o.style = style;
            o.per_record = per;
            o.loss_noise = o.time_noise = noise;
            o.seed = static_cast<uint64_t>(seed);
            o.iterations = kEffectLogIterations;
            if (e.divergence > 0) o.divergence_start = kEffectStart;
            o.divergence_size = e.divergence;
            if (e.slowdown > 0) o.slowdown_start = kEffectStart, o.slowdown_size = e.slowdown;
            int64_t delay = -1;
            for (const LogEvent& ev : Analyze(o)) {
              if (!IsFinding(ev)) continue;
              const int64_t found = ev.found >= 0 ? ev.found : ev.end;
              if (ev.kind == e.kind && found >= kEffectStart && delay < 0)
                delay = found - kEffectStart;
              else if (ev.kind != e.kind || found < kEffectStart)
                ++false_reports;
            }
            if (delay >= 0) delays.push_back(delay);
          }
          std::sort(delays.begin(), delays.end());
          const bool all = static_cast<int>(delays.size()) == seeds;
          if (e.divergence > 0 && (!all || delays.back() > 200)) divergence_ok = false;
          Log("{:<22} {:<19} {:>6} {:>5.1f}% {:>9} {:>12} {:>9} {:>6}", e.name,
              SyntheticLogStyleName(style), per, 100 * noise,
              fmt::format("{}/{}", delays.size(), seeds),
              delays.empty() ? std::string("-") : std::to_string(delays[delays.size() / 2]),
              delays.empty() ? std::string("-") : std::to_string(delays.back()), false_reports);
        }
      }
    }
  }
  int healthy_false = 0, healthy_logs = 0;
  if (healthy > 0) {
    Log("");
    Log("healthy logs of {} iterations: reports (any divergence or throughput drop)",
        kHealthyIterations);
    Log("{:<19} {:>6} {:>6} {:>6} {:>11} {:>16}", "style", "it/rec", "noise", "logs", "divergence",
        "throughput drop");
    for (SyntheticLogStyle style : styles) {
      for (int per : {1, 10}) {
        for (double noise : noises) {
          int div = 0, drop = 0;
          for (int seed = 1; seed <= healthy; ++seed) {
            SyntheticLogOptions o;
            o.style = style;
            o.per_record = per;
            o.loss_noise = o.time_noise = noise;
            o.seed = static_cast<uint64_t>(1000 + seed);
            o.iterations = kHealthyIterations;
            for (const LogEvent& ev : Analyze(o)) {
              div += ev.kind == "divergence";
              drop += ev.kind == "throughput_drop";
            }
          }
          healthy_false += div + drop;
          healthy_logs += healthy;
          Log("{:<19} {:>6} {:>5.1f}% {:>6} {:>11} {:>16}", SyntheticLogStyleName(style), per,
              100 * noise, healthy, div, drop);
        }
      }
    }
  }
  Log("");
  Log("divergence reported within 200 iterations of its start on every log: {}",
      divergence_ok ? "yes" : "NO");
  Log("false reports on {} healthy logs: {}", healthy_logs, healthy_false);
  Log("({:.1f} s)", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return 0;
}

}  // namespace keel::cli

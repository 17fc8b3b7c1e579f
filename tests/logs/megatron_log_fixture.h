// A Megatron-DeepSpeed style training log with known events, in the shapes real logs come in
// (timestamps, [defaultN]: prefixes, a terminal-wrapped line, iteration time in ms), for the
// `keel logs analyze` tests.
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <string>

namespace keel_test {

struct LogEvents {
  bool spike = true;         // lm loss x1.8 and grad norm 40 at iterations 150-152
  bool nan = true;           // iteration 200: lm loss nan, one nan iteration
  bool restart = true;       // after 260 the log resumes at 241 (a process start is logged) ...
  bool resume_spike = true;  // ... and the loss jumps at 245-246
  bool slow_gpu = true;      // TFLOPs 150 -> 140 from iteration 300
  bool divergence = true;    // from 330 the loss rises 15% over 70 iterations
};

inline std::string MegatronLogLine(int64_t it, double loss, double grad, double tflops, int nan) {
  const double ms = 1000.0 * 150.0 / tflops;  // time follows throughput
  return fmt::format(
      " iteration {:8d}/     400 | consumed samples: {:12d} | consumed tokens: {:14d} | elapsed "
      "time per iteration (ms): {:.1f} | learning rate: 3.000E-04 | global batch size: 64 | lm "
      "loss: {} | loss scale: 1.0 | grad norm: {:.3f} | num zeros: 0.0 | number of skipped "
      "iterations: {:3d} | number of nan iterations: {:3d} | samples per second: {:.3f} | TFLOPs: "
      "{:.2f} |",
      it, it * 64, it * 64 * 2048, ms, nan ? std::string("nan") : fmt::format("{:.6E}", loss), grad,
      nan, nan, 64000.0 / ms, tflops);
}

inline std::string GenerateMegatronLog(const LogEvents& ev) {
  std::string log = "using world size: 8, data-parallel-size: 8, tensor-model-parallel size: 1\n";
  uint64_t state = 12345;
  auto noise = [&] {  // deterministic uniform in [-1, 1)
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<double>(state >> 11) / static_cast<double>(1ULL << 52) - 1.0;
  };
  auto emit = [&](int64_t it, bool after_restart) {
    double loss = 3.0 + 4.0 * std::exp(-static_cast<double>(it) / 80.0) + 0.02 * noise();
    double grad = 0.3 + 0.03 * noise();
    double tflops = 150.0 + 0.5 * noise();
    int nan = 0;
    if (ev.spike && it >= 150 && it <= 152) loss *= 1.8, grad = 40;
    if (ev.nan && it == 200) nan = 1;
    if (ev.resume_spike && after_restart && (it == 245 || it == 246)) loss *= 1.5, grad = 20;
    if (ev.slow_gpu && it >= 300) tflops -= 10;
    if (ev.divergence && it >= 330) loss *= 1.0 + 0.15 * static_cast<double>(it - 330) / 70.0;
    std::string line = MegatronLogLine(it, loss, grad, tflops, nan);
    if (it % 7 == 0) line = "[default3]:" + line;
    if (it % 11 == 0) line = fmt::format("[2024-03-01 10:{:02d}:00] ", it % 60) + line;
    if (it == 123) {  // wrapped by a terminal inside a number and inside a field name
      const size_t a = line.find("lm loss: ") + 12, b = line.find("number of nan") + 10;
      line = line.substr(0, a) + "\n" + line.substr(a, b - a) + "\n" + line.substr(b);
    }
    log += line + "\n";
    if (it % 100 == 0)
      log += fmt::format(
          " validation loss at iteration {} | lm loss value: {:.6E} | lm loss PPL: "
          "{:.6E} |\n",
          it, loss, std::exp(loss));
  };
  for (int64_t it = 1; it <= (ev.restart ? 260 : 400); ++it) emit(it, false);
  if (ev.restart) {
    log += "srun: error: node17: task 3: Exited with exit code 1\n";
    log += "using world size: 8, data-parallel-size: 8, tensor-model-parallel size: 1\n";
    log += " loading checkpoint from /ckpt at iteration 240\n";
    for (int64_t it = 241; it <= 400; ++it) emit(it, true);
  }
  return log;
}

// A log for the resume-spike rule: a slowly falling loss with noise of +-0.5% (uniform), iterations
// 1-300, then a restart: from the checkpoint at 240 (the log goes back to 241, a process start is
// logged) or, without `go_back`, a new process that resumes at 301; to 400 (of 400).
struct ResumeLogOptions {
  bool bump = true;         // lm loss x1.06 at the 3rd-6th records after the restart
  bool go_back = true;      // resume at 241 (else at 301)
  double resume_shift = 0;  // the loss after the restart, relative to the trend (-0.01: 1% lower)
  double fall = 0.5;        // the trend: 3 + fall * exp(-iteration / decay)
  double decay = 400;
  int64_t spike_at = 0;  // a loss spike x1.5 at this iteration and the next (0: none)
};

inline double ResumeLogLoss(const ResumeLogOptions& o, int64_t it) {
  return 3.0 + o.fall * std::exp(-static_cast<double>(it) / o.decay);
}

// The first and last iteration of the bump.
inline int64_t ResumeBumpStart(const ResumeLogOptions& o) {
  return (o.go_back ? 241 : 301) + 2;
}

inline std::string GenerateResumeLog(const ResumeLogOptions& o) {
  std::string log = "using world size: 8, data-parallel-size: 8, tensor-model-parallel size: 1\n";
  uint64_t state = 4242;
  auto noise = [&] {  // deterministic uniform in [-1, 1)
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<double>(state >> 11) / static_cast<double>(1ULL << 52) - 1.0;
  };
  auto emit = [&](int64_t it, double factor) {
    double loss = ResumeLogLoss(o, it) * factor * (1 + 0.005 * noise());
    if (o.spike_at > 0 && (it == o.spike_at || it == o.spike_at + 1)) loss *= 1.5;
    log += MegatronLogLine(it, loss, 0.3 * (1 + 0.05 * noise()), 150.0 + 0.3 * noise(), 0) + "\n";
  };
  for (int64_t it = 1; it <= 300; ++it) emit(it, 1.0);
  log += "srun: error: node17: task 3: Exited with exit code 1\n";
  log += "using world size: 8, data-parallel-size: 8, tensor-model-parallel size: 1\n";
  if (o.go_back) log += " loading checkpoint from /ckpt at iteration 240\n";
  const int64_t bump = ResumeBumpStart(o);
  for (int64_t it = o.go_back ? 241 : 301; it <= 400; ++it)
    emit(it, (1 + o.resume_shift) * (o.bump && it >= bump && it < bump + 4 ? 1.06 : 1.0));
  return log;
}

// A keel log (log interval 10, 600 iterations) with a guard rollback after iteration 300 to 250
// whose skipped data window is iterations 255-314, printed as the loop prints it from now on: an
// interval that trained nothing (270-310) has no lm loss, samples per second or TFLOPs field
// (with `zero_throughput`, they are printed as 0), counts its iterations as skipped and none as
// NaN, and its grad norm is nan; the intervals at the window's edges (260, 320) trained some.
inline std::string GenerateSkippedWindowLog(bool zero_throughput) {
  std::string log = "keel train: start\n";
  uint64_t state = 777;
  auto noise = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<double>(state >> 11) / static_cast<double>(1ULL << 52) - 1.0;
  };
  auto emit = [&](int64_t it, bool after_rollback) {
    int trained = 0;
    for (int64_t k = it - 9; k <= it; ++k) trained += !(after_rollback && k >= 255 && k <= 314);
    const int skipped = 10 - trained;
    const double ms = (trained * 1000.0 + skipped * 0.2) / 10;
    std::string line = fmt::format(
        " iteration {:8d}/     600 | consumed samples: {:12d} | consumed tokens: {:12d} | "
        "elapsed time per iteration (ms): {:.1f} | learning rate: 3.000E-04 | global batch "
        "size:    64 |",
        it, it * 64, it * 64 * 128, ms);
    if (trained > 0)
      line += fmt::format(" lm loss: {:.6E} |",
                          3.0 + 2.0 * std::exp(-static_cast<double>(it) / 100.0) + 0.01 * noise());
    line += " loss scale: 1.0 |";
    line += trained > 0 ? fmt::format(" grad norm: {:.3f} |", 0.3 + 0.02 * noise())
                        : std::string(" grad norm: nan |");
    line += fmt::format(
        " num zeros: 0.0 | number of skipped iterations: {:3d} | number of nan iterations:   0 |",
        skipped);
    if (trained > 0)
      line += fmt::format(" samples per second: {:.3f} | TFLOPs: {:.2f} |",
                          64.0 * trained / (ms * 10 / 1000), 150.0 + 0.5 * noise());
    else if (zero_throughput)
      line += " samples per second: 0.000 | TFLOPs: 0.00 |";
    log += line + "\n";
  };
  for (int64_t it = 10; it <= 300; it += 10) emit(it, false);
  log += "guard: rolled back to iter_0000250 (iteration 250); skipping iterations 255..314\n";
  for (int64_t it = 260; it <= 600; it += 10) emit(it, true);
  return log;
}

}  // namespace keel_test

#include "logs/synthetic_log.h"

#include <fmt/format.h>

#include <cmath>

namespace keel {
namespace {

// Deterministic standard normal values (splitmix64 + Box-Muller): the same seed gives the same
// log on every machine and build.
class Gaussian {
 public:
  // The seed is hashed: splitmix64 streams of nearby plain seeds are shifted copies of each other.
  explicit Gaussian(uint64_t seed) : state_(seed) {
    state_ = static_cast<uint64_t>(Uniform() * 0x1p53) * 0x9E3779B97F4A7C15ULL + seed;
  }
  double Next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1 = Uniform(), u2 = Uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    const double r = std::sqrt(-2.0 * std::log(u1)), t = 2.0 * M_PI * u2;
    spare_ = r * std::sin(t);
    has_spare_ = true;
    return r * std::cos(t);
  }

 private:
  double Uniform() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return static_cast<double>(z >> 11) / static_cast<double>(1ULL << 53);
  }
  uint64_t state_;
  bool has_spare_ = false;
  double spare_ = 0;
};

}  // namespace

const char* SyntheticLogStyleName(SyntheticLogStyle s) {
  return s == SyntheticLogStyle::kMegatronLM ? "megatron-lm" : "megatron-deepspeed";
}

double SyntheticHealthyLoss(const SyntheticLogOptions& o, double it) {
  return o.loss_floor + o.loss_amplitude * std::pow(1.0 + it / o.loss_scale, -o.loss_exponent);
}

std::string GenerateSyntheticLog(const SyntheticLogOptions& o) {
  Gaussian g(o.seed);
  std::string out = "using world size: 64, data-parallel-size: 8, tensor-model-parallel size: 4\n";
  const int per = o.per_record > 0 ? o.per_record : 1;
  const double flops_per_iter = 150e12 * o.iteration_seconds;  // 150 TFLOP/s healthy
  int bump_left = 0;
  auto emit = [&](int64_t it) {
    double loss = SyntheticHealthyLoss(o, static_cast<double>(it));
    if (o.divergence_start >= 0 && it > o.divergence_start)
      loss = SyntheticHealthyLoss(o, static_cast<double>(o.divergence_start)) *
             (1.0 + o.divergence_size * static_cast<double>(it - o.divergence_start) /
                        static_cast<double>(o.divergence_iterations));
    if (bump_left > 0) {
      loss *= 1.0 + o.resume_bump;
      --bump_left;
    }
    loss *= 1.0 + o.loss_noise * g.Next();
    double seconds = o.iteration_seconds;
    if (o.slowdown_start >= 0 && it > o.slowdown_start) seconds *= 1.0 + o.slowdown_size;
    seconds *= 1.0 + o.time_noise * g.Next();
    const double ms = 1000.0 * seconds;
    const double lr =
        o.warmup_iterations > 0 && it < o.warmup_iterations
            ? o.learning_rate * static_cast<double>(it) / static_cast<double>(o.warmup_iterations)
            : o.learning_rate;
    const double grad = 0.3 * (1.0 + 0.05 * g.Next());
    const int64_t samples = it * o.global_batch;
    const double tflops = flops_per_iter / seconds / 1e12;
    if (o.style == SyntheticLogStyle::kMegatronLM) {
      // Megatron-LM prints a timestamp before each line.
      const int64_t t = it * static_cast<int64_t>(o.iteration_seconds);
      out += fmt::format(
          " [2025-01-0{} {:02d}:{:02d}:{:02d}] iteration {:8d}/{:8d} | consumed samples: {:12d} | "
          "elapsed time per iteration (ms): {:.1f} | throughput per GPU (TFLOP/s/GPU): {:.1f} | "
          "learning rate: {:.6E} | global batch size: {:5d} | lm loss: {:.6E} | loss scale: 1.0 | "
          "grad norm: {:.3f} | number of skipped iterations: {:3d} | number of nan iterations: "
          "{:3d} |\n",
          1 + (t / 86400) % 9, (t / 3600) % 24, (t / 60) % 60, t % 60, it, o.iterations, samples,
          ms, tflops, lr, o.global_batch, loss, grad, 0, 0);
    } else {
      out += fmt::format(
          " iteration {:8d}/{:8d} | consumed samples: {:12d} | consumed tokens: {:14d} | elapsed "
          "time per iteration (ms): {:.1f} | learning rate: {:.3E} | global batch size: {:5d} | lm "
          "loss: {:.6E} | loss scale: 4096.0 | grad norm: {:.3f} | num zeros: 0.0 | number of "
          "skipped iterations: {:3d} | number of nan iterations: {:3d} | samples per second: "
          "{:.3f} | TFLOPs: {:.2f} |\n",
          it, o.iterations, samples, samples * o.seq_length, ms, lr, o.global_batch, loss, grad, 0,
          0, static_cast<double>(o.global_batch) / seconds, tflops);
    }
  };
  int64_t it = per;
  for (; it <= o.iterations; it += per) {
    emit(it);
    if (o.restart_at >= 0 && it >= o.restart_at && o.resume_from >= 0) break;
  }
  if (o.restart_at >= 0 && o.resume_from >= 0 && it <= o.iterations) {
    out += "srun: error: node17: task 3: Exited with exit code 1\n";
    out += "using world size: 64, data-parallel-size: 8, tensor-model-parallel size: 4\n";
    out += fmt::format(" loading checkpoint from /checkpoints at iteration {}\n", o.resume_from);
    bump_left = o.resume_bump_records;
    for (it = o.resume_from + per; it <= o.iterations; it += per) emit(it);
  }
  return out;
}

}  // namespace keel

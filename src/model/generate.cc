#include "model/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/rng.h"
#include "core/status.h"

namespace keel {

int32_t SampleToken(const std::vector<float>& logits, size_t position,
                    const GenerateOptions& opts) {
  const RngKey key{opts.seed, RngPurpose::kSampling, 0};
  const int V = static_cast<int>(logits.size());
  // Softmax over the top-k logits at the given temperature, in double for a stable draw.
  std::vector<int> idx(V);
  std::iota(idx.begin(), idx.end(), 0);
  const int k = opts.top_k > 0 ? std::min(opts.top_k, V) : V;
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  const double t = std::max(1e-4f, opts.temperature);
  const double mx = logits[idx[0]];
  std::vector<double> p(k);
  double sum = 0.0;
  for (int i = 0; i < k; ++i) sum += p[i] = std::exp((logits[idx[i]] - mx) / t);
  const double u = UniformAt(key, position) * sum;
  double acc = 0.0;
  for (int i = 0; i < k; ++i) {
    acc += p[i];
    if (u < acc) return idx[i];
  }
  return idx[k - 1];
}

std::vector<int32_t> GenerateWith(const NextTokenFn& next, const std::vector<int32_t>& prompt,
                                  const GenerateOptions& opts, int max_positions) {
  const int W = opts.window > 0 ? opts.window : max_positions;
  KEEL_CHECK(!prompt.empty(), "generation needs at least one prompt token");
  std::vector<int32_t> seq = prompt;
  std::vector<int32_t> window(W, 0);
  for (int step = 0; step < opts.max_new_tokens; ++step) {
    const int len = std::min<int>(static_cast<int>(seq.size()), W);
    std::fill(window.begin(), window.end(), 0);
    std::copy(seq.end() - len, seq.end(), window.begin());
    seq.push_back(next(window, len - 1, seq.size()));
  }
  return std::vector<int32_t>(seq.begin() + prompt.size(), seq.end());
}

std::vector<int32_t> Generate(GptModel& model, const std::vector<int32_t>& prompt,
                              const GenerateOptions& opts) {
  return GenerateWith(
      [&](const std::vector<int32_t>& window, int last, size_t position) {
        model.Forward(window.data(), nullptr, 1, static_cast<int>(window.size()), 0.0f);
        return SampleToken(model.LogitsAt(0, last), position, opts);
      },
      prompt, opts, model.spec().max_positions);
}

}  // namespace keel

#include "model/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/rng.h"
#include "core/status.h"

namespace keel {

std::vector<int32_t> Generate(GptModel& model, const std::vector<int32_t>& prompt,
                              const GenerateOptions& opts) {
  const int W = opts.window > 0 ? opts.window : model.spec().max_positions;
  KEEL_CHECK(!prompt.empty(), "generation needs at least one prompt token");
  std::vector<int32_t> seq = prompt;
  std::vector<int32_t> window(W, 0);
  const RngKey key{opts.seed, RngPurpose::kSampling, 0};
  for (int step = 0; step < opts.max_new_tokens; ++step) {
    const int len = std::min<int>(static_cast<int>(seq.size()), W);
    std::fill(window.begin(), window.end(), 0);
    std::copy(seq.end() - len, seq.end(), window.begin());
    model.Forward(window.data(), nullptr, 1, W, 0.0f);
    std::vector<float> logits = model.LogitsAt(0, len - 1);
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
    const double u = UniformAt(key, seq.size()) * sum;
    double acc = 0.0;
    int chosen = idx[k - 1];
    for (int i = 0; i < k; ++i) {
      acc += p[i];
      if (u < acc) {
        chosen = idx[i];
        break;
      }
    }
    seq.push_back(chosen);
  }
  return std::vector<int32_t>(seq.begin() + prompt.size(), seq.end());
}

}  // namespace keel

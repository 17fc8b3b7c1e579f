#include "data/sample_prefetcher.h"

#include <chrono>
#include <cstring>

#include "core/status.h"

namespace keel {

SamplePrefetcher::SamplePrefetcher(ReadFn read, int sample_tokens, int64_t depth)
    : read_(std::move(read)),
      sample_tokens_(sample_tokens),
      depth_(depth),
      tokens_(static_cast<size_t>(depth) * static_cast<size_t>(sample_tokens)),
      origins_(static_cast<size_t>(depth)) {
  KEEL_CHECK(depth >= 1 && sample_tokens >= 1, "prefetch depth and sample size must be >= 1");
  worker_ = std::thread([this] { Worker(); });
}

SamplePrefetcher::~SamplePrefetcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void SamplePrefetcher::Worker() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || (started_ && filled_ - start_ < depth_); });
    if (stop_) return;
    const int64_t index = filled_;
    const uint64_t generation = generation_, resets = resets_;
    int32_t* slot = tokens_.data() + static_cast<size_t>(index % depth_) * sample_tokens_;
    lock.unlock();
    // The slot is outside [start_, filled_), so the loop never reads it while it is written.
    SampleOrigin origin;
    try {
      origin = read_(index, generation, slot);
    } catch (...) {  // handed to the loop's thread, which rethrows it from Get
      lock.lock();
      error_ = std::current_exception();
      cv_.notify_all();
      cv_.wait(lock, [&] { return stop_; });
      return;
    }
    lock.lock();
    if (resets != resets_) continue;  // restarted meanwhile: the read is stale
    origins_[static_cast<size_t>(index % depth_)] = origin;
    filled_ = index + 1;
    cv_.notify_all();
  }
}

SampleOrigin SamplePrefetcher::Get(int64_t index, uint64_t generation, int32_t* tokens) {
  std::unique_lock<std::mutex> lock(mu_);
  ++stats_.served;
  if (!started_ || generation != generation_ || index < start_ || index > filled_) {
    // Not a continuation of the read-ahead (a jump back, or past what is read): start it over.
    started_ = true;
    generation_ = generation;
    start_ = filled_ = index;
    ++resets_;
    ++stats_.restarts;
  } else {
    start_ = index;  // positions before it are not asked for again: their slots are free
  }
  cv_.notify_all();
  if (filled_ <= index) {
    const auto t0 = std::chrono::steady_clock::now();
    ++stats_.waited;
    cv_.wait(lock, [&] { return filled_ > index || error_; });
    stats_.wait_ms +=
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  if (filled_ <= index) std::rethrow_exception(error_);  // only a failed read ends the wait
  const size_t slot = static_cast<size_t>(index % depth_);
  std::memcpy(tokens, tokens_.data() + slot * sample_tokens_, sizeof(int32_t) * sample_tokens_);
  return origins_[slot];
}

SamplePrefetcher::Stats SamplePrefetcher::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace keel

#include "data/sample_prefetcher.h"

#include <chrono>
#include <cstring>

#include "core/status.h"

namespace keel {

SamplePrefetcher::SamplePrefetcher(ReadFn read, int sample_tokens, int64_t depth, int workers)
    : read_(std::move(read)),
      sample_tokens_(sample_tokens),
      depth_(depth),
      tokens_(static_cast<size_t>(depth) * static_cast<size_t>(sample_tokens)),
      origins_(static_cast<size_t>(depth)),
      ready_(static_cast<size_t>(depth), 0) {
  KEEL_CHECK(depth >= 1 && sample_tokens >= 1, "prefetch depth and sample size must be >= 1");
  KEEL_CHECK(workers >= 0, "prefetch workers must be >= 0");
  for (int i = 0; i < workers; ++i) workers_.emplace_back([this] { Worker(); });
}

SamplePrefetcher::~SamplePrefetcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& w : workers_) w.join();
}

void SamplePrefetcher::Worker() {
  // Each worker reads into a buffer of its own and copies the sample into its slot under the
  // lock, so a read made stale by a restart never writes a slot another worker now fills.
  std::vector<int32_t> mine(static_cast<size_t>(sample_tokens_));
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || (started_ && claimed_ - start_ < depth_); });
    if (stop_) return;
    const int64_t index = claimed_++;
    const uint64_t generation = generation_, resets = resets_;
    lock.unlock();
    SampleOrigin origin;
    try {
      origin = read_(index, generation, mine.data());
    } catch (...) {  // handed to the loop's thread, which rethrows it from Get
      lock.lock();
      error_ = std::current_exception();
      cv_.notify_all();
      cv_.wait(lock, [&] { return stop_; });
      return;
    }
    lock.lock();
    if (resets != resets_) continue;  // restarted meanwhile: the read is stale
    const size_t slot = static_cast<size_t>(index % depth_);
    std::memcpy(tokens_.data() + slot * sample_tokens_, mine.data(),
                sizeof(int32_t) * sample_tokens_);
    origins_[slot] = origin;
    ready_[slot] = 1;
    // The buffer holds [start_, filled_) in order: advance past every position now read.
    while (filled_ < claimed_ && ready_[static_cast<size_t>(filled_ % depth_)]) ++filled_;
    cv_.notify_all();
  }
}

SampleOrigin SamplePrefetcher::Get(int64_t index, uint64_t generation, int32_t* tokens) {
  std::unique_lock<std::mutex> lock(mu_);
  ++stats_.served;
  if (workers_.empty()) {  // no read-ahead: read it here
    lock.unlock();
    return read_(index, generation, tokens);
  }
  if (!started_ || generation != generation_ || index < start_ || index > filled_) {
    // Not a continuation of the read-ahead (a jump back, or past what is read): start it over.
    started_ = true;
    generation_ = generation;
    start_ = filled_ = claimed_ = index;
    std::fill(ready_.begin(), ready_.end(), 0);
    ++resets_;
    ++stats_.restarts;
  } else {
    // Positions before it are not asked for again: their slots are free.
    for (int64_t p = start_; p < index; ++p) ready_[static_cast<size_t>(p % depth_)] = 0;
    start_ = index;
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

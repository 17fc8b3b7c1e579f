// SamplePrefetcher: reads training samples ahead of the loop on background threads (Megatron's
// --num-workers), so reading and decoding the data never stalls a step. The loop asks for
// positions in increasing order (the data cursor); the workers keep the next `depth` positions
// ready in a ring buffer, each reading the next position not yet claimed. A jump
// (a resume, a skipped data window, a rollback) or a new data-order generation restarts the
// read-ahead at the position asked for. Samples are a pure function of (position, generation),
// so prefetching never changes what is trained on.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "data/train_data.h"

namespace keel {

class SamplePrefetcher {
 public:
  // Reads sample `index` of data-order `generation` into tokens[sample_tokens]. Called on the
  // worker threads, concurrently when there are several (or on Get's thread with none).
  using ReadFn = std::function<SampleOrigin(int64_t index, uint64_t generation, int32_t* tokens)>;

  // `workers` threads (0: Get reads each sample itself, on its own thread).
  SamplePrefetcher(ReadFn read, int sample_tokens, int64_t depth, int workers = 1);
  // Bytes of the ring buffer a prefetcher of `depth` samples of `sample_tokens` tokens holds.
  static uint64_t BufferBytes(int sample_tokens, int64_t depth) {
    return static_cast<uint64_t>(depth) *
           (static_cast<uint64_t>(sample_tokens) * sizeof(int32_t) + sizeof(SampleOrigin));
  }
  ~SamplePrefetcher();
  SamplePrefetcher(const SamplePrefetcher&) = delete;
  SamplePrefetcher& operator=(const SamplePrefetcher&) = delete;

  // Sample `index` of `generation`: from the buffer when the worker has read it, else after
  // waiting for it (counted in stats()).
  SampleOrigin Get(int64_t index, uint64_t generation, int32_t* tokens);

  struct Stats {
    int64_t served = 0;    // Get calls
    int64_t waited = 0;    // of which had to wait for the worker
    double wait_ms = 0;    // total time those waited
    int64_t restarts = 0;  // read-ahead restarted at a new position or generation
  };
  Stats stats() const;

 private:
  void Worker();

  ReadFn read_;
  const int sample_tokens_;
  const int64_t depth_;
  std::vector<int32_t> tokens_;        // depth_ slots of sample_tokens_
  std::vector<SampleOrigin> origins_;  // per slot
  std::vector<char> ready_;            // per slot: its position has been read
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int64_t start_ = 0;    // lowest position still wanted
  int64_t filled_ = 0;   // positions [start_, filled_) are in the buffer
  int64_t claimed_ = 0;  // positions [filled_, claimed_) are being read (or are read, not next)
  uint64_t generation_ = 0;
  uint64_t resets_ = 0;  // bumped by every restart: a read that straddles one is dropped
  bool started_ = false, stop_ = false;
  std::exception_ptr error_;  // a worker's read failed: Get rethrows it
  Stats stats_;
  std::vector<std::thread> workers_;
};

}  // namespace keel

// GradientReducer: the data-parallel gradient reduction, in buckets issued while the backward pass
// is still running. The model reports, layer by layer, from which offset on its gradients are
// final (the parameters are laid out embedding first, so backward finishes them from the end of
// the buffer towards its start); the reducer cuts what became final into buckets and a worker
// thread reduce-scatters each (Communicator::ReduceScatterSum) while the next layer's backward
// computes. Finish waits for the last bucket. Each element's sum is the same rank-ordered sum
// whatever the bucketing, so overlap changes when bytes move, never the bits.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <thread>

#include "comm/communicator.h"

namespace keel {

struct ReductionStats {
  double comm_seconds = 0;  // the worker's time inside reductions
  double wait_seconds = 0;  // the main thread's time in Finish: the part not hidden
  size_t bytes_sent = 0;    // this rank's bytes sent by the reduce-scatter
  size_t buckets = 0;
};

class GradientReducer {
 public:
  // Buckets of at most `bucket_floats` elements (the last of a ready region may be smaller).
  GradientReducer(Communicator* comm, size_t bucket_floats);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // A new reduction of `grads` (n floats); nothing is final yet.
  void Begin(float* grads, size_t n);
  // Gradients [from, n) are final: issues the new part as buckets.
  void Ready(size_t from);
  // Issues whatever is left ([0, n)) and waits until every bucket is reduced.
  void Finish();
  // Totals since construction.
  const ReductionStats& stats() const { return stats_; }

 private:
  void Worker();

  Communicator* comm_;
  size_t bucket_;
  float* grads_ = nullptr;
  size_t n_ = 0;
  size_t issued_from_ = 0;  // [issued_from_, n_) is queued or done
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<ShardRange> queue_;
  size_t in_flight_ = 0;
  bool stop_ = false;
  ReductionStats stats_;
  std::thread worker_;
};

}  // namespace keel

#include "comm/gradient_reducer.h"

#include <algorithm>
#include <chrono>

namespace keel {
namespace {

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

GradientReducer::GradientReducer(Communicator* comm, size_t bucket_floats)
    : comm_(comm), bucket_(std::max<size_t>(bucket_floats, 1)) {
  if (comm_->world_size() > 1) worker_ = std::thread([this] { Worker(); });
}

GradientReducer::~GradientReducer() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void GradientReducer::Begin(float* grads, size_t n) {
  std::lock_guard<std::mutex> l(mu_);
  grads_ = grads;
  n_ = issued_from_ = n;
}

void GradientReducer::Ready(size_t from) {
  if (comm_->world_size() == 1) return;
  {
    std::lock_guard<std::mutex> l(mu_);
    from = std::min(from, n_);
    // Newest-final first, as backward produced them: bucket ends at issued_from_.
    while (issued_from_ > from) {
      const size_t begin = issued_from_ - std::min(bucket_, issued_from_ - from);
      queue_.push_back({begin, issued_from_});
      issued_from_ = begin;
      ++in_flight_;
    }
  }
  cv_.notify_all();
}

void GradientReducer::Finish() {
  if (comm_->world_size() == 1) return;
  const auto t0 = std::chrono::steady_clock::now();
  Ready(0);
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [this] { return in_flight_ == 0; });
  stats_.wait_seconds += Seconds(t0);
}

void GradientReducer::Worker() {
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    cv_.wait(l, [this] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    const ShardRange b = queue_.front();
    queue_.pop_front();
    float* grads = grads_;
    const size_t n = n_;
    l.unlock();
    const auto t0 = std::chrono::steady_clock::now();
    comm_->ReduceScatterSum(grads, n, b.begin, b.end);
    const double secs = Seconds(t0);
    // What this rank sends: the bucket minus the part it owns.
    const ShardRange own = ShardOf(n, comm_->rank(), comm_->world_size());
    const size_t lo = std::max(b.begin, own.begin), hi = std::min(b.end, own.end);
    const size_t kept = hi > lo ? hi - lo : 0;
    l.lock();
    stats_.comm_seconds += secs;
    stats_.bytes_sent += (b.size() - kept) * sizeof(float);
    ++stats_.buckets;
    if (--in_flight_ == 0) cv_.notify_all();
  }
}

}  // namespace keel

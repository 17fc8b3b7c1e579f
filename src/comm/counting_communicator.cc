#include "comm/counting_communicator.h"

#include <algorithm>
#include <cstdlib>

namespace keel {

int64_t CountingCommunicator::bytes_sent() const {
  int64_t total = 0;
  for (const auto& [kind, c] : counts_) total += c.bytes;
  return total;
}

void CountingCommunicator::Reset() {
  counts_.clear();
  sends_.clear();
}

void CountingCommunicator::Add(const char* kind, int64_t bytes) {
  Count& c = counts_[kind];
  ++c.calls;
  c.bytes += bytes;
}

void CountingCommunicator::ReduceScatterSum(float* data, size_t n, size_t begin, size_t end) {
  if (begin < end && world_size() > 1) {
    const ShardRange mine = ShardOf(n, rank(), world_size());
    const size_t lo = std::max(mine.begin, begin), hi = std::max(lo, std::min(mine.end, end));
    Add("reduce-scatter", static_cast<int64_t>((end - begin) - (hi - lo)) * 4);
  }
  inner_->ReduceScatterSum(data, n, begin, end);
}

void CountingCommunicator::AllGather(float* data, size_t n) {
  if (world_size() > 1) {
    const ShardRange mine = ShardOf(n, rank(), world_size());
    Add("all-gather", static_cast<int64_t>(mine.size()) * 4 * (world_size() - 1));
  }
  inner_->AllGather(data, n);
}

void CountingCommunicator::AllGatherBytes(const std::string& mine, std::vector<std::string>* all) {
  if (world_size() > 1)
    Add("all-gather-bytes", static_cast<int64_t>(mine.size()) * (world_size() - 1));
  inner_->AllGatherBytes(mine, all);
}

void CountingCommunicator::AllGatherChunks(const float* mine, float* all, size_t chunk) {
  if (world_size() > 1)
    Add("all-gather-chunks", static_cast<int64_t>(chunk) * 4 * (world_size() - 1));
  inner_->AllGatherChunks(mine, all, chunk);
}

void CountingCommunicator::ReduceScatterChunks(const float* all, float* mine, size_t chunk) {
  if (world_size() > 1)
    Add("reduce-scatter-chunks", static_cast<int64_t>(chunk) * 4 * (world_size() - 1));
  inner_->ReduceScatterChunks(all, mine, chunk);
}

void CountingCommunicator::Send(const float* data, size_t n, int peer) {
  Add("send", static_cast<int64_t>(n) * 4);
  sends_.push_back(n);
  inner_->Send(data, n, peer);
}

void CountingCommunicator::Abort(int exit_code) {
  inner_->Abort(exit_code);
  std::abort();  // not reached: the compiler does not see through the virtual call
}

}  // namespace keel

// Ranks as threads of one process (MakeThreadGroup, comm/communicator.h). Every collective is one
// exchange: each rank deposits its bytes, the last to arrive publishes them all, and each rank
// reads the published copy before it can arrive at the next exchange. Sums are taken in rank
// order, as the MPI communicator takes them, so a layout gives the same bits either way.
#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <tuple>

#include "comm/communicator.h"

namespace keel {
namespace {

struct GroupState {
  explicit GroupState(int n) : size(n), slots(n) {}
  const int size;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  std::vector<std::string> slots, published;
  // Point to point: per (from, to) the messages sent and not yet received, in order.
  std::map<std::pair<int, int>, std::deque<std::string>> mail;
  // The groups made by Split: per (split number, color) one state, made by its first member.
  std::map<std::pair<uint64_t, int>, std::shared_ptr<GroupState>> children;
};

class ThreadCommunicator : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<GroupState> g, int rank) : g_(std::move(g)), rank_(rank) {}

  int rank() const override { return rank_; }
  int world_size() const override { return g_->size; }
  std::string Describe() const override {
    return fmt::format("thread group, rank {} of {}", rank_, g_->size);
  }

  void ReduceScatterSum(float* data, size_t n, size_t begin, size_t end) override {
    if (begin >= end) return;
    const std::vector<std::string> all = Exchange(Bytes(data + begin, end - begin));
    const ShardRange mine = ShardOf(n, rank_, g_->size);
    const size_t lo = std::max(mine.begin, begin), hi = std::min(mine.end, end);
    for (size_t i = lo; i < hi; ++i) {
      float s = Float(all[0], i - begin);
      for (size_t r = 1; r < all.size(); ++r) s += Float(all[r], i - begin);
      data[i] = s;
    }
  }

  void AllGather(float* data, size_t n) override {
    const ShardRange mine = ShardOf(n, rank_, g_->size);
    const std::vector<std::string> all = Exchange(Bytes(data + mine.begin, mine.size()));
    for (int r = 0; r < g_->size; ++r) {
      const ShardRange s = ShardOf(n, r, g_->size);
      std::memcpy(data + s.begin, all[r].data(), s.size() * sizeof(float));
    }
  }

  void AllGatherBytes(const std::string& mine, std::vector<std::string>* all) override {
    *all = Exchange(mine);
  }

  void ReduceScatterChunks(const float* all, float* mine, size_t chunk) override {
    // Every rank publishes its whole buffer; each reads only its own chunk of the others'.
    const std::vector<std::string> parts = Exchange(Bytes(all, chunk * g_->size));
    const size_t at = static_cast<size_t>(rank_) * chunk;
    for (size_t i = 0; i < chunk; ++i) {
      float s = Float(parts[0], at + i);
      for (size_t r = 1; r < parts.size(); ++r) s += Float(parts[r], at + i);
      mine[i] = s;
    }
  }

  void AllGatherChunks(const float* mine, float* all, size_t chunk) override {
    const std::vector<std::string> parts = Exchange(Bytes(mine, chunk));
    for (int r = 0; r < g_->size; ++r)
      std::memcpy(all + static_cast<size_t>(r) * chunk, parts[r].data(), chunk * sizeof(float));
  }

  void Send(const float* data, size_t n, int peer) override {
    CheckPeer(peer);
    std::lock_guard<std::mutex> lock(g_->mu);
    g_->mail[{rank_, peer}].push_back(Bytes(data, n));
    g_->cv.notify_all();
  }

  void Recv(float* data, size_t n, int peer) override {
    CheckPeer(peer);
    std::unique_lock<std::mutex> lock(g_->mu);
    auto& box = g_->mail[{peer, rank_}];
    g_->cv.wait(lock, [&] { return !box.empty(); });
    const std::string msg = std::move(box.front());
    box.pop_front();
    KEEL_CHECK(msg.size() == n * sizeof(float),
               fmt::format("rank {} received {} floats from rank {} but expected {}", rank_,
                           msg.size() / sizeof(float), peer, n));
    std::memcpy(data, msg.data(), msg.size());
  }

  std::unique_ptr<Communicator> Split(int color, int key) override {
    const uint64_t split = splits_++;
    std::string mine(2 * sizeof(int), '\0');
    std::memcpy(mine.data(), &color, sizeof(int));
    std::memcpy(mine.data() + sizeof(int), &key, sizeof(int));
    const std::vector<std::string> all = Exchange(mine);
    std::vector<std::tuple<int, int>> members;  // (key, rank) of this color
    for (int r = 0; r < g_->size; ++r) {
      int c, k;
      std::memcpy(&c, all[r].data(), sizeof(int));
      std::memcpy(&k, all[r].data() + sizeof(int), sizeof(int));
      if (c == color) members.emplace_back(k, r);
    }
    std::sort(members.begin(), members.end());
    const int sub_rank = static_cast<int>(
        std::find(members.begin(), members.end(), std::make_tuple(key, rank_)) - members.begin());
    std::shared_ptr<GroupState> child;
    {
      std::lock_guard<std::mutex> lock(g_->mu);
      auto& slot = g_->children[{split, color}];
      if (!slot) slot = std::make_shared<GroupState>(static_cast<int>(members.size()));
      child = slot;
    }
    return std::make_unique<ThreadCommunicator>(child, sub_rank);
  }

  void Barrier() override { Exchange(std::string()); }
  [[noreturn]] void Abort(int exit_code) override { std::_Exit(exit_code); }

 private:
  static std::string Bytes(const float* p, size_t n) {
    return std::string(reinterpret_cast<const char*>(p), n * sizeof(float));
  }
  static float Float(const std::string& s, size_t i) {
    float v;
    std::memcpy(&v, s.data() + i * sizeof(float), sizeof(float));
    return v;
  }
  void CheckPeer(int peer) const {
    KEEL_CHECK(peer >= 0 && peer < g_->size && peer != rank_,
               fmt::format("rank {} of {} cannot exchange with rank {}", rank_, g_->size, peer));
  }

  std::vector<std::string> Exchange(std::string mine) {
    std::unique_lock<std::mutex> lock(g_->mu);
    g_->slots[rank_] = std::move(mine);
    const uint64_t gen = g_->generation;
    if (++g_->arrived == g_->size) {
      g_->published = g_->slots;
      g_->arrived = 0;
      ++g_->generation;
      g_->cv.notify_all();
    } else {
      g_->cv.wait(lock, [&] { return g_->generation != gen; });
    }
    return g_->published;
  }

  std::shared_ptr<GroupState> g_;
  int rank_;
  uint64_t splits_ = 0;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> MakeThreadGroup(int n) {
  auto g = std::make_shared<GroupState>(n);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < n; ++r) out.push_back(std::make_unique<ThreadCommunicator>(g, r));
  return out;
}

}  // namespace keel

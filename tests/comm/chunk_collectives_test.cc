// Sequence parallelism's all-gather and reduce-scatter of equal chunks in rank order
// (Communicator::AllGatherChunks / ReduceScatterChunks): the thread group's and the defaults (on
// AllGatherBytes) give the same bits, the sum taken in rank order.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"

namespace keel {
namespace {

void RunRanks(int n, const std::function<void(int, Communicator*)>& f) {
  auto comms = MakeThreadGroup(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { f(r, comms[r].get()); });
  for (auto& t : threads) t.join();
}

// Forwards the primitives only, so the chunk collectives run Communicator's defaults.
class DefaultsOnly : public Communicator {
 public:
  explicit DefaultsOnly(Communicator* c) : c_(c) {}
  int rank() const override { return c_->rank(); }
  int world_size() const override { return c_->world_size(); }
  std::string Describe() const override { return c_->Describe(); }
  void ReduceScatterSum(float* d, size_t n, size_t b, size_t e) override {
    c_->ReduceScatterSum(d, n, b, e);
  }
  void AllGather(float* d, size_t n) override { c_->AllGather(d, n); }
  void AllGatherBytes(const std::string& m, std::vector<std::string>* a) override {
    c_->AllGatherBytes(m, a);
  }
  void Barrier() override { c_->Barrier(); }
  [[noreturn]] void Abort(int code) override {
    c_->Abort(code);
    std::abort();
  }

 private:
  Communicator* c_;
};

TEST(ChunkCollectivesTest, GatherAndReduceScatterInRankOrder) {
  // 1e8 + 1 - 1e8 in rank order is 0 in fp32: the order shows in the bits.
  const float big[3] = {1e8f, 1.0f, -1e8f};
  const size_t chunk = 5;
  for (bool defaults : {false, true}) {
    std::vector<std::vector<float>> gathered(3), scattered(3);
    RunRanks(3, [&](int r, Communicator* comm) {
      DefaultsOnly wrapped(comm);
      Communicator* c = defaults ? static_cast<Communicator*>(&wrapped) : comm;
      std::vector<float> mine(chunk, static_cast<float>(r + 1)), all(3 * chunk);
      c->AllGatherChunks(mine.data(), all.data(), chunk);
      gathered[r] = all;
      std::vector<float> full(3 * chunk);
      for (size_t i = 0; i < full.size(); ++i) full[i] = big[r] + (i == 0 ? 0.0f : float(i));
      std::vector<float> out(chunk);
      c->ReduceScatterChunks(full.data(), out.data(), chunk);
      scattered[r] = out;
    });
    EXPECT_EQ(scattered[0][0], 0.0f);  // (1e8 + 1) - 1e8, not 1
    for (int r = 0; r < 3; ++r) {
      for (size_t i = 0; i < 3 * chunk; ++i) EXPECT_EQ(gathered[r][i], float(i / chunk + 1));
      for (size_t i = 0; i < chunk; ++i) {
        const size_t at = r * chunk + i;
        const float want = ((big[0] + float(at)) + (big[1] + float(at))) + (big[2] + float(at));
        EXPECT_EQ(scattered[r][i], want) << defaults;
      }
    }
  }
}

}  // namespace
}  // namespace keel

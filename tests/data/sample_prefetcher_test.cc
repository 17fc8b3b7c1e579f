// SamplePrefetcher: what Get returns is exactly what the read function gives for (position,
// generation), through sequential reads, jumps back and forward and a new generation; the worker
// reads ahead on its own (so the loop finds the next samples ready) and never reads a position
// twice while the loop walks forward; a failed read surfaces in the loop's thread.
#include "data/sample_prefetcher.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <stdexcept>
#include <thread>

namespace keel {
namespace {

constexpr int kTokens = 5;

SampleOrigin Expected(int64_t index, uint64_t gen, int32_t* t) {
  for (int i = 0; i < kTokens; ++i) t[i] = static_cast<int32_t>(index * 10 + i + gen * 100000);
  return {static_cast<int>(index % 3), static_cast<int64_t>(gen)};
}

// --num-workers: 0 (read on the loop's thread), Megatron's default 2, and more than the buffer
// holds positions in flight.
class SamplePrefetcherWorkers : public ::testing::TestWithParam<int> {};

TEST_P(SamplePrefetcherWorkers, ReturnsWhatTheReadFunctionGivesThroughJumpsAndGenerations) {
  SamplePrefetcher p(Expected, kTokens, 8, GetParam());
  int32_t got[kTokens], want[kTokens];
  auto check = [&](int64_t index, uint64_t gen) {
    const SampleOrigin o = p.Get(index, gen, got);
    const SampleOrigin w = Expected(index, gen, want);
    ASSERT_EQ(std::vector<int32_t>(got, got + kTokens), std::vector<int32_t>(want, want + kTokens))
        << "index " << index << " generation " << gen;
    EXPECT_EQ(o.dataset, w.dataset);
    EXPECT_EQ(o.epoch, w.epoch);
  };
  for (int64_t i = 0; i < 40; ++i) check(i, 0);
  for (int64_t i = 10; i < 20; ++i) check(i, 0);       // back (a rollback)
  for (int64_t i = 100; i < 130; i += 3) check(i, 0);  // forward with gaps (a skipped window)
  for (int64_t i = 130; i < 140; ++i) check(i, 1);     // a new data order
  for (int64_t i = 5; i < 9; ++i) check(i, 0);
  const auto s = p.stats();
  EXPECT_EQ(s.served, 40 + 10 + 10 + 10 + 4);
  if (GetParam() > 0) {
    EXPECT_GE(s.restarts, 4);  // start, back, each forward gap, generation
  }
}

INSTANTIATE_TEST_SUITE_P(Workers, SamplePrefetcherWorkers, ::testing::Values(0, 1, 2, 12));

// Several workers read concurrently, each position at most once while the loop walks forward,
// with reads finishing out of order (later positions faster): the loop still gets every sample
// exactly as the read function gives it, in order.
TEST(SamplePrefetcherTest, ParallelWorkersReadEachPositionOnceAndDeliverInOrder) {
  std::mutex mu;
  std::map<int64_t, int> reads;
  std::atomic<int> in_flight{0}, most_in_flight{0};
  SamplePrefetcher p(
      [&](int64_t index, uint64_t gen, int32_t* t) {
        const int now = ++in_flight;
        for (int seen = most_in_flight;
             now > seen && !most_in_flight.compare_exchange_weak(seen, now);) {
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200 * (3 - index % 3)));
        {
          std::lock_guard<std::mutex> lock(mu);
          ++reads[index];
        }
        --in_flight;
        return Expected(index, gen, t);
      },
      kTokens, 16, 4);
  int32_t got[kTokens], want[kTokens];
  for (int64_t i = 0; i < 200; ++i) {
    p.Get(i, 0, got);
    Expected(i, 0, want);
    ASSERT_EQ(std::vector<int32_t>(got, got + kTokens), std::vector<int32_t>(want, want + kTokens))
        << i;
  }
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& [index, n] : reads) EXPECT_EQ(n, 1) << "position " << index;
  EXPECT_GT(most_in_flight.load(), 1);  // the workers did read concurrently
}

TEST(SamplePrefetcherTest, ReadsAheadOnItsOwnAndEachPositionOnce) {
  std::mutex mu;
  std::map<int64_t, int> reads;
  SamplePrefetcher p(
      [&](int64_t index, uint64_t gen, int32_t* t) {
        std::lock_guard<std::mutex> lock(mu);
        ++reads[index];
        return Expected(index, gen, t);
      },
      kTokens, 16);
  int32_t buf[kTokens];
  p.Get(0, 0, buf);
  // Without another call, the worker fills the next 15 positions.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (reads.size() >= 16) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(reads.size(), 16u);
    EXPECT_EQ(reads.rbegin()->first, 15);  // and no further: the buffer is full
  }
  const int64_t waited_before = p.stats().waited;
  for (int64_t i = 1; i < 16; ++i) p.Get(i, 0, buf);
  EXPECT_EQ(p.stats().waited, waited_before);  // all 15 were ready
  for (int64_t i = 16; i < 200; ++i) p.Get(i, 0, buf);
  std::lock_guard<std::mutex> lock(mu);
  for (int64_t i = 0; i < 200; ++i) EXPECT_EQ(reads[i], 1) << "position " << i;
}

TEST(SamplePrefetcherTest, AFailedReadSurfacesInTheCallersThread) {
  SamplePrefetcher p(
      [](int64_t index, uint64_t gen, int32_t* t) {
        if (index == 3) throw std::runtime_error("disk on fire");
        return Expected(index, gen, t);
      },
      kTokens, 4);
  int32_t buf[kTokens];
  EXPECT_NO_THROW(p.Get(0, 0, buf));
  try {
    for (int64_t i = 1; i < 5; ++i) p.Get(i, 0, buf);
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "disk on fire");
  }
}

}  // namespace
}  // namespace keel

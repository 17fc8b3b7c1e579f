// CountingCommunicator: the bytes a rank sends, per kind, are what keel's MPI communicator puts on
// the wire (an all-reduce: 2 (n-1)/n of the buffer, the ring's volume), and the results are the
// inner communicator's.
#include "comm/counting_communicator.h"

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "core/shard_range.h"

namespace keel {
namespace {

void RunRanks(int n, const std::function<void(int, Communicator*)>& f) {
  auto comms = MakeThreadGroup(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { f(r, comms[r].get()); });
  for (auto& t : threads) t.join();
}

TEST(CountingCommunicatorTest, AllReduceSendsTwiceTheOthersShareOfTheBuffer) {
  for (int world : {2, 4}) {
    const size_t n = 16 * 4 * 10;  // shards of whole cache lines: equal at 2 and 4 ranks
    std::vector<int64_t> bytes(world);
    std::vector<std::vector<float>> out(world);
    RunRanks(world, [&](int r, Communicator* inner) {
      CountingCommunicator c(inner);
      std::vector<float> v(n, static_cast<float>(r + 1));
      c.AllReduceSum(v.data(), n);
      bytes[r] = c.bytes_sent();
      EXPECT_EQ(c.counts().at("reduce-scatter").calls, 1);
      EXPECT_EQ(c.counts().at("all-gather").calls, 1);
      out[r] = v;
    });
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(bytes[r], static_cast<int64_t>(2 * (world - 1) * n * 4 / world)) << world;
      EXPECT_EQ(out[r], std::vector<float>(n, world * (world + 1) / 2.0f));
    }
  }
}

TEST(CountingCommunicatorTest, UnevenShardsAndChunksAndPointToPoint) {
  // 100 floats on 3 ranks: shards of 48, 48, 4 (whole cache lines but the last).
  std::vector<std::map<std::string, CountingCommunicator::Count>> counts(3);
  RunRanks(3, [&](int r, Communicator* inner) {
    CountingCommunicator c(inner);
    std::vector<float> v(100, 1.0f), all(3 * 8), mine(8, 1.0f);
    c.ReduceScatterSum(v.data(), 100, 0, 100);
    c.AllGather(v.data(), 100);
    c.AllGatherChunks(mine.data(), all.data(), 8);
    c.ReduceScatterChunks(all.data(), mine.data(), 8);
    if (r == 0) c.Send(v.data(), 10, 1);
    if (r == 1) c.Recv(v.data(), 10, 0);
    double loss = 1;
    c.AllReduceSumHost(&loss, 1);
    EXPECT_EQ(loss, 3.0);
    counts[r] = c.counts();
  });
  for (int r = 0; r < 3; ++r) {
    const size_t shard = ShardOf(100, r, 3).size();
    EXPECT_EQ(counts[r].at("reduce-scatter").bytes, static_cast<int64_t>(100 - shard) * 4) << r;
    EXPECT_EQ(counts[r].at("all-gather").bytes, static_cast<int64_t>(shard) * 4 * 2) << r;
    EXPECT_EQ(counts[r].at("all-gather-chunks").bytes, 8 * 4 * 2);
    EXPECT_EQ(counts[r].at("reduce-scatter-chunks").bytes, 8 * 4 * 2);
    EXPECT_EQ(counts[r].at("all-gather-bytes").bytes, 8 * 2);  // the host double
    EXPECT_EQ(counts[r].count("send"), r == 0 ? 1u : 0u);
  }
  EXPECT_EQ(counts[0].at("send").bytes, 40);
}

}  // namespace
}  // namespace keel

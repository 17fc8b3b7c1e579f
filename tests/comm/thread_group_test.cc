// MakeThreadGroup: ranks as threads give the same collectives as MPI (sums in rank order, the same
// bits on every rank), point to point in order, and Split into groups; and ProcessMesh cuts a
// world into Megatron's (pipeline x data x tensor) order on it.
#include <gtest/gtest.h>

#include <functional>
#include <thread>

#include "comm/communicator.h"
#include "comm/process_mesh.h"

namespace keel {
namespace {

// Runs f(rank, comm) on every rank of a thread group of n, each on its own thread.
void RunRanks(int n, const std::function<void(int, Communicator*)>& f) {
  auto comms = MakeThreadGroup(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { f(r, comms[r].get()); });
  for (auto& t : threads) t.join();
}

TEST(ThreadGroupTest, AllReduceSumIsTheRankOrderSumOnEveryRank) {
  // 1e8 + 1 - 1e8 in rank order is 0 in fp32, not 1: the order is visible in the bits.
  const float values[3] = {1e8f, 1.0f, -1e8f};
  std::vector<std::vector<float>> out(3);
  RunRanks(3, [&](int r, Communicator* c) {
    std::vector<float> v(7, values[r]);
    v[6] = static_cast<float>(r);
    c->AllReduceSum(v.data(), v.size());
    out[r] = v;
  });
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 6; ++i) EXPECT_EQ(out[r][i], (1e8f + 1.0f) - 1e8f) << r;
    EXPECT_EQ(out[r][6], 3.0f);
  }
}

TEST(ThreadGroupTest, AllReduceMaxAndBytesAndPointToPoint) {
  std::vector<std::vector<float>> maxes(2), got(2);
  std::vector<std::vector<std::string>> bytes(2);
  RunRanks(2, [&](int r, Communicator* c) {
    std::vector<float> v = {static_cast<float>(r), static_cast<float>(-r)};
    c->AllReduceMax(v.data(), 2);
    maxes[r] = v;
    c->AllGatherBytes(std::string(r + 1, 'a' + r), &bytes[r]);
    std::vector<float> msg = {1.5f + r, 2.5f};
    if (r == 0) {
      c->Send(msg.data(), 2, 1);
      got[0].resize(2);
      c->Recv(got[0].data(), 2, 1);
    } else {
      got[1].resize(2);
      c->Recv(got[1].data(), 2, 0);
      c->Send(msg.data(), 2, 0);
    }
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(maxes[r], (std::vector<float>{1.0f, 0.0f}));
    EXPECT_EQ(bytes[r], (std::vector<std::string>{"a", "bb"}));
  }
  EXPECT_EQ(got[1], (std::vector<float>{1.5f, 2.5f}));
  EXPECT_EQ(got[0], (std::vector<float>{2.5f, 2.5f}));
}

TEST(ProcessMeshTest, CoordinatesFollowMegatronsOrder) {
  const MeshShape s{2, 3, 2};  // T 2, P 3, D 2: 12 ranks
  EXPECT_EQ(s.world(), 12);
  for (int r = 0; r < 12; ++r) EXPECT_EQ(RankOf(s, CoordsOf(s, r)), r);
  const MeshCoords c = CoordsOf(s, 7);  // (pp 1, dp 1, tp 1): (1 * 2 + 1) * 2 + 1
  EXPECT_EQ(c.pp, 1);
  EXPECT_EQ(c.dp, 1);
  EXPECT_EQ(c.tp, 1);
  EXPECT_EQ(c.ToString(), "dp 1, pp 1, tp 1");
  EXPECT_EQ(CoordsOf(s, 1).tp, 1);  // tensor ranks adjacent
  EXPECT_EQ(CoordsOf(s, 2).dp, 1);
  EXPECT_EQ(CoordsOf(s, 4).pp, 1);
}

TEST(ProcessMeshTest, GroupsHoldTheRanksThatShareTheOtherCoordinates) {
  // T 2 x P 2 x D 2 on 8 threads: each rank's group members, named by world rank (gathered).
  struct Seen {
    std::vector<std::string> tensor, data, pipeline;
    MeshCoords c;
  };
  std::vector<Seen> seen(8);
  RunRanks(8, [&](int r, Communicator* world) {
    std::unique_ptr<ProcessMesh> m;
    ASSERT_TRUE(ProcessMesh::Make(world, 2, 2, &m).ok());
    const std::string me = std::to_string(r);
    m->tensor()->AllGatherBytes(me, &seen[r].tensor);
    m->data()->AllGatherBytes(me, &seen[r].data);
    m->pipeline()->AllGatherBytes(me, &seen[r].pipeline);
    seen[r].c = m->coords();
    EXPECT_EQ(m->tensor()->rank(), m->coords().tp);
    EXPECT_EQ(m->data()->rank(), m->coords().dp);
    EXPECT_EQ(m->pipeline()->rank(), m->coords().pp);
  });
  // Rank 5 = (pp 1, dp 0, tp 1): tensor group {4, 5}, data group {5, 7}, pipeline group {1, 5}.
  EXPECT_EQ(seen[5].tensor, (std::vector<std::string>{"4", "5"}));
  EXPECT_EQ(seen[5].data, (std::vector<std::string>{"5", "7"}));
  EXPECT_EQ(seen[5].pipeline, (std::vector<std::string>{"1", "5"}));
}

TEST(ProcessMeshTest, RefusesAWorldThatIsNotAMultipleOfTensorTimesPipeline) {
  RunRanks(3, [&](int, Communicator* world) {
    std::unique_ptr<ProcessMesh> m;
    const Status st = ProcessMesh::Make(world, 2, 1, &m);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("multiple"), std::string::npos) << st.message();
  });
}

}  // namespace
}  // namespace keel

// RecordingCommunicator: the flight recorder and the in-step checks, driven through a fake
// three-rank communicator whose other ranks echo this rank's bytes (in step) or a tampered copy.
#include "comm/recording_communicator.h"

#include <gtest/gtest.h>

#include <functional>

namespace keel {
namespace {

struct Aborted {
  int code;
};

// Rank 0 of `world`; every other rank sends what `other(r, mine)` returns.
class FakeComm : public Communicator {
 public:
  explicit FakeComm(int world) : world_(world) {}
  std::function<std::string(int, const std::string&)> other = [](int, const std::string& m) {
    return m;
  };
  int rank() const override { return 0; }
  int world_size() const override { return world_; }
  std::string Describe() const override { return "fake"; }
  void ReduceScatterSum(float*, size_t, size_t, size_t) override { ++data_calls; }
  void AllGather(float*, size_t) override { ++data_calls; }
  void AllGatherBytes(const std::string& mine, std::vector<std::string>* all) override {
    all->assign(1, mine);
    for (int r = 1; r < world_; ++r) all->push_back(other(r, mine));
    ++byte_calls;
  }
  void Send(const float*, size_t, int) override { ++p2p_calls; }
  void Recv(float*, size_t, int) override { ++p2p_calls; }
  void Barrier() override {}
  [[noreturn]] void Abort(int code) override { throw Aborted{code}; }
  int data_calls = 0, byte_calls = 0, p2p_calls = 0;

 private:
  int world_;
};

TEST(RecordingCommunicatorTest, RecordsEveryCollectiveWithSequenceKindAndSize) {
  FakeComm fake(3);
  RecordingCommunicator comm(&fake, Env::Default());
  std::vector<float> g(64, 1.0f);
  comm.ReduceScatterSum(g.data(), 64, 0, 32);
  double v[2] = {1, 2};
  comm.AllReduceSumHost(v, 2);
  EXPECT_EQ(v[0], 3.0);  // three ranks sent 1
  comm.AllGather(g.data(), 64);
  const auto recs = comm.recorder().Recent();
  ASSERT_EQ(recs.size(), 3u);
  EXPECT_EQ(recs[0].seq, 1u);
  EXPECT_EQ(recs[0].kind, "reduce-scatter");
  EXPECT_EQ(recs[0].bytes, 32 * sizeof(float));
  EXPECT_EQ(recs[1].kind, "all-reduce-sum");
  EXPECT_EQ(recs[1].bytes, 2 * sizeof(double));
  EXPECT_EQ(recs[2].kind, "all-gather");
  for (const auto& r : recs) EXPECT_FALSE(r.in_flight());
  EXPECT_EQ(comm.recorder().digest().count, 3u);
}

TEST(RecordingCommunicatorTest, KeepsTheLast64) {
  FakeComm fake(2);
  RecordingCommunicator comm(&fake, Env::Default());
  for (int i = 0; i < 100; ++i) comm.Barrier();
  const auto recs = comm.recorder().Recent();
  ASSERT_EQ(recs.size(), CollectiveRecorder::kCapacity);
  EXPECT_EQ(recs.front().seq, 37u);
  EXPECT_EQ(recs.back().seq, 100u);
}

TEST(RecordingCommunicatorTest, DigestDependsOnOrderKindAndSize) {
  auto digest = [](std::function<void(RecordingCommunicator&)> f) {
    FakeComm fake(2);
    RecordingCommunicator comm(&fake, Env::Default());
    f(comm);
    return comm.recorder().digest().hash;
  };
  std::vector<float> g(64);
  double v[3] = {};
  const uint64_t a = digest([&](auto& c) {
    c.AllGather(g.data(), 64);
    c.AllReduceSumHost(v, 2);
  });
  const uint64_t b = digest([&](auto& c) {
    c.AllReduceSumHost(v, 2);
    c.AllGather(g.data(), 64);
  });
  const uint64_t c3 = digest([&](auto& c) {
    c.AllGather(g.data(), 64);
    c.AllReduceSumHost(v, 3);
  });
  EXPECT_NE(a, b);
  EXPECT_NE(a, c3);
}

// A rank whose header differs (another size, or one collective fewer) ends the job with exit 4,
// naming it.
TEST(RecordingCommunicatorTest, RankOutOfStepIsNamedAndTheJobEnds) {
  FakeComm fake(3);
  RecordingCommunicator comm(&fake, Env::Default());
  std::string report;
  comm.set_on_out_of_step([&](const std::string& r) { report = r; });
  double v[2] = {1, 2};
  comm.AllReduceSumHost(v, 2);  // in step
  fake.other = [](int r, const std::string& mine) {
    std::string s = mine;
    if (r == 1) s[16] = static_cast<char>(s[16] + 8);  // its size field: 8 bytes more
    return s;
  };
  try {
    comm.AllReduceSumHost(v, 2);
    FAIL() << "no abort";
  } catch (const Aborted& a) {
    EXPECT_EQ(a.code, 4);
  }
  EXPECT_NE(report.find("rank 1 is at #2 all-reduce-sum (24 B)"), std::string::npos) << report;
  EXPECT_NE(report.find("ranks 0,2 are at #2 all-reduce-sum (16 B)"), std::string::npos) << report;
}

// A plain gather (each rank's file list, host name) may differ in size across ranks: no abort,
// and the digests stay equal.
TEST(RecordingCommunicatorTest, GathersOfDifferentSizesAreInStep) {
  FakeComm fake(2);
  RecordingCommunicator comm(&fake, Env::Default());
  const uint64_t before = comm.recorder().digest().hash;
  fake.other = [](int, const std::string& mine) { return mine + "more"; };
  std::vector<std::string> all;
  comm.AllGatherBytes("abc", &all);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0], "abc");
  EXPECT_EQ(all[1], "abcmore");
  FakeComm fake2(2);
  RecordingCommunicator other(&fake2, Env::Default());
  other.AllGatherBytes("a much longer list", &all);
  EXPECT_NE(comm.recorder().digest().hash, before);
  EXPECT_EQ(comm.recorder().digest().hash, other.recorder().digest().hash);
}

// One rank's error, with a message of any length, reaches every rank as that error: it is not
// mistaken for the ranks being out of step (the message makes that rank's payload longer).
TEST(RecordingCommunicatorTest, AnErrorOnOneRankKeepsItsCodeAndMessage) {
  // What rank 1 sends: recorded from a communicator of its own that fails with a long message.
  FakeComm rank1_inner(3);
  std::string rank1_bytes;
  rank1_inner.other = [&](int r, const std::string& mine) {
    if (r == 1) rank1_bytes = mine;
    return mine;
  };
  RecordingCommunicator rank1(&rank1_inner, Env::Default());
  const std::string message(300, 'x');
  EXPECT_FALSE(rank1.AgreeOnStatus(Status::InvalidArgument(message)).ok());
  ASSERT_FALSE(rank1_bytes.empty());

  FakeComm fake(3);
  RecordingCommunicator comm(&fake, Env::Default());
  std::string report;
  comm.set_on_out_of_step([&](const std::string& r) { report = r; });
  fake.other = [&](int r, const std::string& mine) { return r == 1 ? rank1_bytes : mine; };
  Status st;
  try {
    st = comm.AgreeOnStatus(Status::OK());
  } catch (const Aborted& a) {
    FAIL() << "aborted with " << a.code << ": " << report;
  }
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(st.message(), "rank 1: " + message);
  EXPECT_TRUE(report.empty()) << report;
}

TEST(RecordingCommunicatorTest, CheckEveryAgreesBeforeGradientCollectives) {
  FakeComm fake(3);
  RecordingCommunicator comm(&fake, Env::Default());
  std::vector<float> g(64);
  comm.ReduceScatterSum(g.data(), 64, 0, 64);
  EXPECT_EQ(fake.byte_calls, 0) << "no header exchange by default";
  comm.set_check_every(true);
  comm.ReduceScatterSum(g.data(), 64, 0, 64);
  EXPECT_EQ(fake.byte_calls, 1);
  EXPECT_EQ(fake.data_calls, 2);
  std::string report;
  comm.set_on_out_of_step([&](const std::string& r) { report = r; });
  fake.other = [](int r, const std::string& mine) {
    std::string s = mine;
    if (r == 2) s[0] = static_cast<char>(s[0] - 1);  // one collective behind: it skipped one
    return s;
  };
  EXPECT_THROW(comm.AllGather(g.data(), 64), Aborted);
  EXPECT_EQ(fake.data_calls, 2) << "the mismatched collective never ran";
  EXPECT_NE(report.find("rank 2 is at #2"), std::string::npos) << report;
  EXPECT_NE(report.find("rank 2 ran fewer collectives: it skipped one"), std::string::npos)
      << report;
}

TEST(RecordingCommunicatorTest, SkipFaultSkipsWithoutRecording) {
  FakeComm fake(2);
  RecordingCommunicator comm(&fake, Env::Default());
  int asked = 0;
  comm.set_skip_fault(
      [&](const std::string& kind) { return kind == "all-reduce-max" && !asked++; });
  double v = 5;
  comm.AllReduceMaxHost(&v, 1);
  EXPECT_EQ(fake.byte_calls, 0);
  EXPECT_EQ(comm.recorder().digest().count, 0u);
  comm.AllReduceMaxHost(&v, 1);
  EXPECT_EQ(comm.recorder().digest().count, 1u);
}

// A pipeline's sends and receives: in a recorder of their own (the two ends differ, so they must
// stay out of the digest the ranks compare), with the peer in the kind; the test-only fault seam
// runs inside the transfer, while it is in flight.
TEST(RecordingCommunicatorTest, PointToPointIsRecordedApartFromTheDigest) {
  FakeComm fake(2);
  RecordingCommunicator comm(&fake, Env::Default());
  std::vector<std::string> seen;
  comm.set_p2p_fault([&](const std::string& kind) {
    seen.push_back(kind);
    EXPECT_TRUE(comm.p2p_recorder().Recent().back().in_flight());
  });
  std::vector<float> x(16, 1.0f);
  comm.Send(x.data(), 16, 1);
  comm.Recv(x.data(), 8, 1);
  EXPECT_EQ(fake.p2p_calls, 2);
  EXPECT_EQ(seen, (std::vector<std::string>{"send-to-1", "recv-from-1"}));
  EXPECT_EQ(comm.recorder().digest().count, 0u);
  EXPECT_TRUE(comm.recorder().Recent().empty());
  const auto recs = comm.p2p_recorder().Recent();
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[0].kind, "send-to-1");
  EXPECT_EQ(recs[0].bytes, 16 * sizeof(float));
  EXPECT_EQ(recs[1].kind, "recv-from-1");
  EXPECT_FALSE(recs[1].in_flight());
}

}  // namespace
}  // namespace keel

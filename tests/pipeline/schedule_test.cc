// The pipeline schedule as a value: Megatron-LM's compute orders, and the simulated run of every
// stage's actions with blocking sends and receives: no deadlock, sends matched, forwards before
// backwards, 1F1B's memory bound, and the bubble of Narayanan et al. 2021 exactly.
#include "pipeline/schedule.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

namespace keel {
namespace {

std::string Orders(const PipelineSchedule& s) {
  std::string out;
  for (int r = 0; r < s.stages; ++r) {
    out += fmt::format("stage {}:", r);
    for (const PipeAction& a : s.actions[r]) out += fmt::format(" {}", ToString(a));
    out += "\n";
  }
  return out;
}

std::string Computes(const std::vector<PipeAction>& v) {
  std::vector<std::string> out;
  for (const PipeAction& a : v) out.push_back(ToString(a));
  return fmt::format("{}", fmt::join(out, " "));
}

TEST(PipelineScheduleTest, OneFOneBComputeOrderIsMegatrons) {
  // P 4, m 6: stage r warms up with P - r - 1 forwards.
  EXPECT_EQ(Computes(ComputeOrder(4, 6, 1, 0)),
            "F(0,0) F(1,0) F(2,0) F(3,0) B(0,0) F(4,0) B(1,0) F(5,0) B(2,0) B(3,0) B(4,0) B(5,0)");
  EXPECT_EQ(Computes(ComputeOrder(4, 6, 1, 3)),
            "F(0,0) B(0,0) F(1,0) B(1,0) F(2,0) B(2,0) F(3,0) B(3,0) F(4,0) B(4,0) F(5,0) B(5,0)");
  // Fewer micro-batches than the warm-up: all forwards, then all backwards.
  EXPECT_EQ(Computes(ComputeOrder(4, 2, 1, 0)), "F(0,0) F(1,0) B(0,0) B(1,0)");
}

TEST(PipelineScheduleTest, InterleavedComputeOrderIsMegatrons) {
  // P 2, V 2, m 4: chunks advance every P micro-batches; stage 0 warms up with
  // (P - 1) 2 + (V - 1) P = 4 forwards, stage 1 with 2; backwards take the chunks in reverse.
  EXPECT_EQ(Computes(ComputeOrder(2, 4, 2, 0)),
            "F(0,0) F(1,0) F(0,1) F(1,1) F(2,0) B(0,1) F(3,0) B(1,1) F(2,1) B(0,0) F(3,1) B(1,0) "
            "B(2,1) B(3,1) B(2,0) B(3,0)");
  EXPECT_EQ(Computes(ComputeOrder(2, 4, 2, 1)),
            "F(0,0) F(1,0) F(0,1) B(0,1) F(1,1) B(1,1) F(2,0) B(0,0) F(3,0) B(1,0) F(2,1) B(2,1) "
            "F(3,1) B(3,1) B(2,0) B(3,0)");
  // m == P: every forward first (Megatron-LM's all-warm-up case).
  EXPECT_EQ(Computes(ComputeOrder(2, 2, 2, 1)),
            "F(0,0) F(1,0) F(0,1) F(1,1) B(0,1) B(1,1) "
            "B(0,0) B(1,0)");
}

TEST(PipelineScheduleTest, RefusesWhatMegatronRefuses) {
  PipelineSchedule s;
  Status st = MakePipelineSchedule(4, 6, 2, &s);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("multiple of the pipeline size (4)"), std::string::npos)
      << st.message();
  EXPECT_FALSE(MakePipelineSchedule(1, 4, 2, &s).ok());
  EXPECT_FALSE(MakePipelineSchedule(2, 0, 1, &s).ok());
}

// Every (P, m, V) the executor tests run, and larger: the simulated run with blocking sends ends,
// and its bubble is the closed form.
TEST(PipelineScheduleTest, SimulatedBubbleIsTheClosedForm) {
  for (int P = 1; P <= 8; ++P) {
    for (int V = 1; V <= 4; ++V) {
      if (V > 1 && P < 2) continue;
      for (int m = 1; m <= 24; ++m) {
        if (V > 1 && m % P != 0) continue;
        PipelineSchedule s;
        ASSERT_TRUE(MakePipelineSchedule(P, m, V, &s).ok());
        PipeSimulation sim;
        const Status st = SimulateSchedule(s, PipeCosts{}, &sim);
        ASSERT_TRUE(st.ok()) << "P " << P << " m " << m << " V " << V << ": " << st.ToString()
                             << "\n"
                             << Orders(s);
        // Unit forward, backward 2, per chunk: busy 3 V m per stage, bubble 3 (P - 1).
        EXPECT_DOUBLE_EQ(sim.makespan, 3.0 * (V * m + P - 1))
            << "P " << P << " m " << m << " V " << V << "\n"
            << Orders(s);
        EXPECT_NEAR(sim.bubble_fraction, (P - 1.0) / (V * m + P - 1), 1e-12);
        EXPECT_NEAR(sim.bubble_over_ideal, (P - 1.0) / (V * m), 1e-12);
        for (int r = 0; r < P; ++r) {
          EXPECT_DOUBLE_EQ(sim.busy[r], 3.0 * V * m);
          // 1F1B holds at most P - r micro-batches' activations (fewer when m is smaller);
          // interleaved, its warm-up plus one (chunks of 1/V of a stage each).
          const int bound =
              V == 1 ? std::min(P - r, m)
                     : (m == P ? V * m : std::min((P - r - 1) * 2 + (V - 1) * P + 1, V * m));
          EXPECT_EQ(sim.peak_in_flight[r], bound)
              << "P " << P << " m " << m << " V " << V << " stage " << r;
        }
      }
    }
  }
}

TEST(PipelineScheduleTest, OtherCostsGiveTheClosedFormToo) {
  // Forward 2, backward 3, per chunk: makespan (f + b)(V m + P - 1).
  PipelineSchedule s;
  ASSERT_TRUE(MakePipelineSchedule(4, 8, 1, &s, PipeCosts{2, 3, 0}).ok());
  PipeSimulation sim;
  ASSERT_TRUE(SimulateSchedule(s, PipeCosts{2, 3, 0}, &sim).ok());
  EXPECT_DOUBLE_EQ(sim.makespan, 5.0 * (8 + 3));
  // A schedule ordered for other costs still runs (no deadlock), only not in the ideal time.
  ASSERT_TRUE(SimulateSchedule(s, PipeCosts{1, 5, 0.5}, &sim).ok());
  EXPECT_GT(sim.bubble_fraction, 0);
}

TEST(PipelineScheduleTest, SendsAndReceivesPairUpBetweenNeighbours) {
  PipelineSchedule s;
  ASSERT_TRUE(MakePipelineSchedule(3, 5, 1, &s).ok());
  int sends = 0, recvs = 0;
  for (int r = 0; r < 3; ++r) {
    for (const PipeAction& a : s.actions[r]) {
      if (a.op == PipeOp::kSendActivation || a.op == PipeOp::kSendGrad) {
        ++sends;
        EXPECT_EQ(std::abs(a.peer - r), 1);
        EXPECT_EQ(a.peer, a.op == PipeOp::kSendActivation ? r + 1 : r - 1);
      }
      if (a.op == PipeOp::kRecvActivation || a.op == PipeOp::kRecvGrad) ++recvs;
    }
  }
  EXPECT_EQ(sends, 2 * 5 * 2);  // m activations and m gradients over each of the 2 boundaries
  EXPECT_EQ(recvs, sends);
}

// The checks can fail: a deadlock, a mismatched pair and a backward first are each named.
TEST(PipelineScheduleTest, SimulationCatchesBrokenSchedules) {
  PipelineSchedule s;
  ASSERT_TRUE(MakePipelineSchedule(2, 2, 1, &s).ok());
  PipeSimulation sim;
  // Both stages sending first: with blocking sends that is a deadlock.
  PipelineSchedule dead = s;
  dead.actions[0] = {{PipeOp::kForward, 0, 0},           {PipeOp::kRecvGrad, 0, 0, 1},
                     {PipeOp::kSendActivation, 0, 0, 1}, {PipeOp::kBackward, 0, 0},
                     {PipeOp::kForward, 1, 0},           {PipeOp::kSendActivation, 1, 0, 1},
                     {PipeOp::kRecvGrad, 1, 0, 1},       {PipeOp::kBackward, 1, 0}};
  Status st = SimulateSchedule(dead, PipeCosts{}, &sim);
  EXPECT_EQ(st.code(), Status::Code::kInternal);
  EXPECT_NE(st.message().find("deadlocks: stage 0 at recvG(0,0)<-1, stage 1 at recvA(0,0)<-0"),
            std::string::npos)
      << st.message();
  // Stage 0 sending micro-batch 1 where stage 1 expects 0.
  PipelineSchedule swapped = s;
  for (PipeAction& a : swapped.actions[0]) {
    if (a.op == PipeOp::kSendActivation) a.microbatch = 1 - a.microbatch;
  }
  st = SimulateSchedule(swapped, PipeCosts{}, &sim);
  EXPECT_NE(st.message().find("receives recvA(0,0)<-0 while stage 0 sends sendA(1,0)->1"),
            std::string::npos)
      << st.message();
  PipelineSchedule backward_first = s;
  auto& stage1 = backward_first.actions[1];
  const auto first_f = std::find(stage1.begin(), stage1.end(), PipeAction{PipeOp::kForward, 0, 0});
  const auto first_b = std::find(stage1.begin(), stage1.end(), PipeAction{PipeOp::kBackward, 0, 0});
  std::iter_swap(first_f, first_b);
  st = SimulateSchedule(backward_first, PipeCosts{}, &sim);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.ToString() << Orders(s);
  EXPECT_NE(st.message().find("stage 1: B(0,0) comes before its forward"), std::string::npos)
      << st.message();
}

}  // namespace
}  // namespace keel

// The pipeline schedule as a value: for P stages, m micro-batches and V model chunks per stage,
// the ordered actions of every stage (compute and blocking point to point), which the executor
// (pipeline/executor.h) runs and SimulateSchedule prices. docs/pipeline.md.
//
// Compute order: Megatron-LM's (megatron/core/pipeline_parallel/schedules.py).
//   V = 1, 1F1B: stage r runs min(P - r - 1, m) warm-up forwards, then alternates one forward and
//     one backward, then the remaining backwards.
//   V > 1, interleaved (m % P == 0): stage r holds virtual stages r, P + r, ..., (V-1) P + r; the
//     k-th forward runs chunk (k mod P V) / P on micro-batch (k / P V) P + k mod P (backwards the
//     same with the chunks in reverse); (P - r - 1) 2 + (V - 1) P warm-up forwards (all of them
//     when m == P), then forward/backward pairs, then the remaining backwards.
//
// Communication: each Send blocks until its Recv is posted (MPI's rendezvous, the worst case).
// The sends and receives are placed by an event simulation of the compute order at the ordering
// costs: a message passes when both its stages are between computes (a stage between computes
// takes any message sent to it), and a stage whose receiver is mid-compute goes on computing and
// sends at a later gap of both (waiting instead costs bubble: P 5, V 2, m 10 loses a forward).
// Every stage's actions are the simulation's events in time order, one consistent global order of
// pairs, so the schedule cannot deadlock whatever the real costs; at the ordering costs it takes
// exactly the simulated time, which for uniform costs is the closed-form bubble (tested up to P 8,
// V 4, m 24).
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace keel {

enum class PipeOp {
  kForward,         // forward of (micro-batch, chunk)
  kBackward,        // backward of (micro-batch, chunk)
  kSendActivation,  // this chunk's forward output to `peer`
  kRecvActivation,  // this chunk's forward input from `peer`
  kSendGrad,        // this chunk's input gradient to `peer`
  kRecvGrad,        // this chunk's output gradient from `peer`
};

struct PipeAction {
  PipeOp op = PipeOp::kForward;
  int microbatch = 0;
  int chunk = 0;  // the model chunk on this stage the action computes or feeds
  int peer = -1;  // the other stage of a send or receive
  bool operator==(const PipeAction&) const = default;
};

// "F(3,1)", "sendA(3,1)->2", "recvG(0,0)<-1": for messages and tests.
std::string ToString(const PipeAction& a);

struct PipelineSchedule {
  int stages = 1;                                // P
  int microbatches = 1;                          // m
  int chunks = 1;                                // V
  std::vector<std::vector<PipeAction>> actions;  // per stage, in order

  // Virtual stage (c P + r) of chunk c on stage r, and back.
  int VirtualStage(int stage, int chunk) const { return chunk * stages + stage; }
  int StageOf(int virtual_stage) const { return virtual_stage % stages; }
  int ChunkOf(int virtual_stage) const { return virtual_stage / stages; }
  int virtual_stages() const { return stages * chunks; }
};

// Costs for the ordering and the simulation: per chunk action; a send/receive pair takes `p2p`.
struct PipeCosts {
  double forward = 1, backward = 2, p2p = 0;
};

// The schedule for P stages, m micro-batches and V chunks: 1F1B for V = 1, the interleaved one
// for V > 1 (needs P >= 2 and m % P == 0, as Megatron-LM). InvalidArgument naming the rule.
// `order_costs` only steers the order of sends and receives between computes.
Status MakePipelineSchedule(int stages, int microbatches, int chunks, PipelineSchedule* out,
                            const PipeCosts& order_costs = {});

// Megatron-LM's compute order of one stage (forwards and backwards only).
std::vector<PipeAction> ComputeOrder(int stages, int microbatches, int chunks, int stage);

struct PipeSimulation {
  double makespan = 0;              // first action to last, over all stages
  std::vector<double> busy;         // per stage: compute time
  std::vector<int> peak_in_flight;  // per stage: most (micro-batch, chunk) forwarded, not yet
                                    // backwarded (activations held)
  // The bubble as a share of the iteration, (makespan - busy) / makespan with the busiest stage:
  // (P-1)/(m+P-1) for 1F1B, (P-1)/(V m+P-1) interleaved, at forward:backward costs uniform per
  // chunk.
  double bubble_fraction = 0;
  // The bubble relative to the ideal time, (makespan - busy) / busy: Narayanan et al. 2021's
  // (p-1)/m, and (p-1)/(v m) interleaved.
  double bubble_over_ideal = 0;
};

// Runs every stage's actions with blocking sends and receives (a pair starts when both ends are
// there). Internal error naming each stuck stage's action on a deadlock, on a receive that does
// not match its send (other micro-batch, chunk or kind), or on a compute whose input never came;
// InvalidArgument on a malformed schedule (a micro-batch's backward before its forward, an action
// missing or repeated).
Status SimulateSchedule(const PipelineSchedule& s, const PipeCosts& costs, PipeSimulation* out);

}  // namespace keel

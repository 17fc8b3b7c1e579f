#include "pipeline/schedule.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <set>
#include <tuple>

namespace keel {
namespace {

bool IsCompute(PipeOp op) {
  return op == PipeOp::kForward || op == PipeOp::kBackward;
}
bool IsSend(PipeOp op) {
  return op == PipeOp::kSendActivation || op == PipeOp::kSendGrad;
}

// What a compute hands on: the forward's output to virtual stage s + 1, the backward's input
// gradient to s - 1 (none past either end).
struct Msg {
  bool grad = false;
  int mb = 0, src_chunk = 0, dst = 0, dst_chunk = 0;
};
using InputKey = std::tuple<bool, int, int>;  // (gradient?, micro-batch, consuming chunk)

bool Downstream(const PipelineSchedule& s, int stage, const PipeAction& c, Msg* m) {
  const int v = s.VirtualStage(stage, c.chunk);
  const bool fwd = c.op == PipeOp::kForward;
  const int to = fwd ? v + 1 : v - 1;
  if (to < 0 || to >= s.virtual_stages()) return false;
  *m = {!fwd, c.microbatch, c.chunk, s.StageOf(to), s.ChunkOf(to)};
  return true;
}

// Whether the compute needs an input from another virtual stage (not the first forward, not the
// last stage's backward, which starts from the loss).
bool NeedsInput(const PipelineSchedule& s, int stage, const PipeAction& c) {
  const int v = s.VirtualStage(stage, c.chunk);
  return c.op == PipeOp::kForward ? v > 0 : v < s.virtual_stages() - 1;
}

double CostOf(const PipeCosts& k, PipeOp op) {
  return op == PipeOp::kForward ? k.forward : k.backward;
}

// Orders the sends and receives around each stage's computes (see schedule.h): an event
// simulation where a stage between computes accepts any message sent to it, sends what its last
// compute produced (blocking until the receiver is between computes), and starts its next compute
// once its sends are done and its input is there.
Status Linearize(PipelineSchedule* s, const PipeCosts& k) {
  const int P = s->stages;
  struct Rank {
    std::vector<PipeAction> order;
    size_t next = 0;
    bool computing = false;
    double until = 0;
    std::vector<Msg> pending;
    std::set<InputKey> have;
  };
  std::vector<Rank> ranks(P);
  for (int r = 0; r < P; ++r) ranks[r].order = ComputeOrder(P, s->microbatches, s->chunks, r);
  s->actions.assign(P, {});
  double t = 0;
  for (;;) {
    for (int r = 0; r < P; ++r) {
      Rank& R = ranks[r];
      if (!R.computing || R.until > t) continue;
      R.computing = false;
      const PipeAction& done = R.order[R.next - 1];
      Msg m;
      if (!Downstream(*s, r, done, &m)) continue;
      if (m.dst == r) {
        R.have.insert({m.grad, m.mb, m.dst_chunk});
      } else {
        R.pending.push_back(m);
      }
    }
    for (int r = 0; r < P; ++r) {
      Rank& R = ranks[r];
      if (R.computing) continue;
      for (size_t i = 0; i < R.pending.size();) {
        const Msg m = R.pending[i];
        Rank& D = ranks[m.dst];
        if (D.computing) {
          ++i;
          continue;
        }
        s->actions[r].push_back(
            {m.grad ? PipeOp::kSendGrad : PipeOp::kSendActivation, m.mb, m.src_chunk, m.dst});
        s->actions[m.dst].push_back(
            {m.grad ? PipeOp::kRecvGrad : PipeOp::kRecvActivation, m.mb, m.dst_chunk, r});
        D.have.insert({m.grad, m.mb, m.dst_chunk});
        R.pending.erase(R.pending.begin() + static_cast<long>(i));
      }
    }
    bool all_done = true;
    double next_t = std::numeric_limits<double>::infinity();
    for (int r = 0; r < P; ++r) {
      Rank& R = ranks[r];
      // Sends still pending are to stages mid-compute: they go at a later gap of both, so
      // neither waits on the other's compute (waiting there costs bubble: P 5, V 2, m 10).
      if (!R.computing && R.next < R.order.size()) {
        const PipeAction& c = R.order[R.next];
        const InputKey key{c.op == PipeOp::kBackward, c.microbatch, c.chunk};
        if (!NeedsInput(*s, r, c) || R.have.erase(key) > 0) {
          s->actions[r].push_back(c);
          R.computing = true;
          R.until = t + CostOf(k, c.op);
          ++R.next;
        }
      }
      if (R.computing) next_t = std::min(next_t, R.until);
      if (R.computing || !R.pending.empty() || R.next < R.order.size()) all_done = false;
    }
    if (all_done) return Status::OK();
    if (next_t == std::numeric_limits<double>::infinity()) {
      return Status::Internal(fmt::format(
          "pipeline schedule P {} m {} V {}: the compute order deadlocks (a bug in keel)", P,
          s->microbatches, s->chunks));
    }
    t = next_t;
  }
}

const char* OpName(PipeOp op) {
  switch (op) {
    case PipeOp::kForward:
      return "F";
    case PipeOp::kBackward:
      return "B";
    case PipeOp::kSendActivation:
      return "sendA";
    case PipeOp::kRecvActivation:
      return "recvA";
    case PipeOp::kSendGrad:
      return "sendG";
    case PipeOp::kRecvGrad:
      return "recvG";
  }
  return "?";
}

}  // namespace

std::string ToString(const PipeAction& a) {
  std::string s = fmt::format("{}({},{})", OpName(a.op), a.microbatch, a.chunk);
  if (IsCompute(a.op)) return s;
  return s + (IsSend(a.op) ? "->" : "<-") + std::to_string(a.peer);
}

std::vector<PipeAction> ComputeOrder(int P, int m, int V, int r) {
  std::vector<PipeAction> f, b;  // the k-th forward and backward
  if (V == 1) {
    for (int i = 0; i < m; ++i) {
      f.push_back({PipeOp::kForward, i, 0});
      b.push_back({PipeOp::kBackward, i, 0});
    }
  } else {
    const int group = P * V;
    for (int k = 0; k < m * V; ++k) {
      const int mb = k / group * P + k % P, chunk = k % group / P;
      f.push_back({PipeOp::kForward, mb, chunk});
      b.push_back({PipeOp::kBackward, mb, V - 1 - chunk});
    }
  }
  const int total = static_cast<int>(f.size());
  int warmup = V == 1 ? P - r - 1 : (m == P ? total : (P - r - 1) * 2 + (V - 1) * P);
  warmup = std::min(warmup, total);
  std::vector<PipeAction> order(f.begin(), f.begin() + warmup);
  for (int j = 0; j < total - warmup; ++j) {
    order.push_back(f[warmup + j]);
    order.push_back(b[j]);
  }
  for (int j = total - warmup; j < total; ++j) order.push_back(b[j]);
  return order;
}

Status MakePipelineSchedule(int P, int m, int V, PipelineSchedule* out,
                            const PipeCosts& order_costs) {
  if (P < 1 || m < 1 || V < 1) {
    return Status::InvalidArgument(fmt::format(
        "pipeline schedule: stages {}, micro-batches {} and chunks {} must each be at least 1", P,
        m, V));
  }
  if (V > 1 && P < 2) {
    return Status::InvalidArgument(
        "the interleaved pipeline schedule needs at least 2 pipeline stages");
  }
  if (V > 1 && m % P != 0) {
    return Status::InvalidArgument(fmt::format(
        "the interleaved pipeline schedule needs the micro-batches ({}) to be a multiple of the "
        "pipeline size ({}) (Megatron-LM's rule); change the batch or drop interleaving",
        m, P));
  }
  if (!(order_costs.forward > 0 && order_costs.backward > 0)) {
    return Status::InvalidArgument("pipeline schedule: forward and backward costs must be > 0");
  }
  PipelineSchedule s;
  s.stages = P, s.microbatches = m, s.chunks = V;
  if (Status st = Linearize(&s, order_costs); !st.ok()) return st;
  *out = std::move(s);
  return Status::OK();
}

Status SimulateSchedule(const PipelineSchedule& s, const PipeCosts& k, PipeSimulation* out) {
  const int P = s.stages, m = s.microbatches, V = s.chunks;
  if (static_cast<int>(s.actions.size()) != P)
    return Status::InvalidArgument(
        fmt::format("pipeline schedule: {} action lists for {} stages", s.actions.size(), P));
  // Each stage runs each (micro-batch, chunk)'s forward once, then its backward once.
  for (int r = 0; r < P; ++r) {
    std::vector<int> state(static_cast<size_t>(m) * V, 0);  // 0 none, 1 forwarded, 2 backwarded
    for (const PipeAction& a : s.actions[r]) {
      if (a.microbatch < 0 || a.microbatch >= m || a.chunk < 0 || a.chunk >= V ||
          (!IsCompute(a.op) && (a.peer < 0 || a.peer >= P || a.peer == r))) {
        return Status::InvalidArgument(
            fmt::format("stage {}: action {} is outside the schedule", r, ToString(a)));
      }
      if (!IsCompute(a.op)) continue;
      int& st = state[static_cast<size_t>(a.microbatch) * V + a.chunk];
      const int want = a.op == PipeOp::kForward ? 0 : 1;
      if (st != want) {
        return Status::InvalidArgument(fmt::format(
            "stage {}: {} {}", r, ToString(a),
            want == 0 ? "repeats a forward" : "comes before its forward or repeats a backward"));
      }
      ++st;
    }
    for (size_t i = 0; i < state.size(); ++i) {
      if (state[i] != 2) {
        return Status::InvalidArgument(fmt::format("stage {}: micro-batch {} chunk {} is never {}",
                                                   r, i / V, i % V,
                                                   state[i] == 0 ? "forwarded" : "backwarded"));
      }
    }
  }
  struct Rank {
    size_t pc = 0;
    double clock = 0, busy = 0;
    int in_flight = 0, peak = 0;
    std::set<InputKey> inputs;    // received, or handed on within the stage
    std::set<InputKey> produced;  // outputs computed, not yet sent
  };
  std::vector<Rank> ranks(P);
  auto compute = [&](int r, const PipeAction& a) -> Status {
    Rank& R = ranks[r];
    const bool bwd = a.op == PipeOp::kBackward;
    if (NeedsInput(s, r, a) && R.inputs.erase({bwd, a.microbatch, a.chunk}) == 0) {
      return Status::Internal(
          fmt::format("stage {}: {} runs before its input arrived", r, ToString(a)));
    }
    R.clock += CostOf(k, a.op);
    R.busy += CostOf(k, a.op);
    R.in_flight += bwd ? -1 : 1;
    R.peak = std::max(R.peak, R.in_flight);
    Msg msg;
    if (Downstream(s, r, a, &msg)) {
      if (msg.dst == r) {
        R.inputs.insert({msg.grad, msg.mb, msg.dst_chunk});
      } else {
        R.produced.insert({msg.grad, msg.mb, msg.src_chunk});
      }
    }
    return Status::OK();
  };
  // A send on `a` and the receive on its peer, if that is the peer's current action.
  auto pair = [&](int a, int b, bool* moved) -> Status {
    const PipeAction& snd = s.actions[a][ranks[a].pc];
    if (ranks[b].pc >= s.actions[b].size()) return Status::OK();
    const PipeAction& rcv = s.actions[b][ranks[b].pc];
    if (IsCompute(rcv.op) || IsSend(rcv.op) || rcv.peer != a) return Status::OK();
    const bool grad = snd.op == PipeOp::kSendGrad;
    const int from = s.VirtualStage(a, snd.chunk), to = s.VirtualStage(b, rcv.chunk);
    if (grad != (rcv.op == PipeOp::kRecvGrad) || snd.microbatch != rcv.microbatch ||
        to != from + (grad ? -1 : 1)) {
      return Status::Internal(fmt::format("stage {} receives {} while stage {} sends {}", b,
                                          ToString(rcv), a, ToString(snd)));
    }
    if (ranks[a].produced.erase({grad, snd.microbatch, snd.chunk}) == 0) {
      return Status::Internal(
          fmt::format("stage {}: {} sends an output not computed yet", a, ToString(snd)));
    }
    const double t = std::max(ranks[a].clock, ranks[b].clock) + k.p2p;
    ranks[a].clock = ranks[b].clock = t;
    ranks[b].inputs.insert({grad, rcv.microbatch, rcv.chunk});
    ++ranks[a].pc, ++ranks[b].pc;
    *moved = true;
    return Status::OK();
  };
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < P; ++r) {
      while (ranks[r].pc < s.actions[r].size()) {
        const PipeAction& a = s.actions[r][ranks[r].pc];
        const size_t before = ranks[r].pc;
        if (IsCompute(a.op)) {
          if (Status st = compute(r, a); !st.ok()) return st;
          ++ranks[r].pc;
          moved = true;
        } else if (IsSend(a.op)) {
          if (Status st = pair(r, a.peer, &moved); !st.ok()) return st;
        } else {
          const int from = a.peer;
          if (ranks[from].pc < s.actions[from].size() &&
              IsSend(s.actions[from][ranks[from].pc].op) &&
              s.actions[from][ranks[from].pc].peer == r) {
            if (Status st = pair(from, r, &moved); !st.ok()) return st;
          }
        }
        if (ranks[r].pc == before) break;
      }
    }
  }
  std::vector<std::string> stuck;
  for (int r = 0; r < P; ++r) {
    if (ranks[r].pc < s.actions[r].size())
      stuck.push_back(fmt::format("stage {} at {}", r, ToString(s.actions[r][ranks[r].pc])));
  }
  if (!stuck.empty()) {
    return Status::Internal(fmt::format("pipeline schedule P {} m {} V {} deadlocks: {}", P, m, V,
                                        fmt::join(stuck, ", ")));
  }
  PipeSimulation sim;
  double busiest = 0;
  for (const Rank& R : ranks) {
    sim.makespan = std::max(sim.makespan, R.clock);
    sim.busy.push_back(R.busy);
    sim.peak_in_flight.push_back(R.peak);
    busiest = std::max(busiest, R.busy);
  }
  sim.bubble_fraction = (sim.makespan - busiest) / sim.makespan;
  sim.bubble_over_ideal = (sim.makespan - busiest) / busiest;
  *out = std::move(sim);
  return Status::OK();
}

}  // namespace keel

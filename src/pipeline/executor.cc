#include "pipeline/executor.h"

#include <fmt/format.h>

#include <chrono>
#include <map>
#include <tuple>
#include <vector>

namespace keel {
namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// (gradient?, micro-batch, chunk): a boundary tensor waiting to be consumed or sent.
using Key = std::tuple<bool, int, int>;

}  // namespace

Status RunPipelineSchedule(const PipelineSchedule& s, Communicator* comm, const StageFunctions& fns,
                           PipelineRunStats* stats) {
  if (comm->world_size() != s.stages) {
    return Status::InvalidArgument(
        fmt::format("pipeline schedule for {} stages run on a pipeline group of {} ranks", s.stages,
                    comm->world_size()));
  }
  if (!fns.forward || !fns.backward || (s.virtual_stages() > 1 && fns.activation_floats == 0)) {
    return Status::InvalidArgument(
        "pipeline stage: forward, backward and the activation size are all needed");
  }
  const int r = comm->rank(), S = s.virtual_stages();
  const size_t n = fns.activation_floats;
  // Inputs received (or handed on within this stage) and outputs waiting for their send.
  std::map<Key, std::vector<float>> inputs, outputs;
  PipelineRunStats st;
  const Clock::time_point start = Clock::now();
  auto take = [](std::map<Key, std::vector<float>>* m, const Key& k, std::vector<float>* out) {
    auto it = m->find(k);
    if (it == m->end()) return false;
    *out = std::move(it->second);
    m->erase(it);
    return true;
  };
  for (const PipeAction& a : s.actions[r]) {
    const int v = s.VirtualStage(r, a.chunk);
    switch (a.op) {
      case PipeOp::kForward:
      case PipeOp::kBackward: {
        const bool fwd = a.op == PipeOp::kForward;
        const bool has_input = fwd ? v > 0 : v < S - 1;
        const int to = fwd ? v + 1 : v - 1;
        const bool has_output = to >= 0 && to < S;
        std::vector<float> in, out(has_output ? n : 0);
        if (has_input && !take(&inputs, {!fwd, a.microbatch, a.chunk}, &in)) {
          return Status::Internal(fmt::format(
              "pipeline stage {}: {} has no input (a bug in the schedule)", r, ToString(a)));
        }
        const Clock::time_point t0 = Clock::now();
        if (fwd) {
          fns.forward(a.microbatch, a.chunk, has_input ? in.data() : nullptr,
                      has_output ? out.data() : nullptr);
        } else {
          fns.backward(a.microbatch, a.chunk, has_input ? in.data() : nullptr,
                       has_output ? out.data() : nullptr);
        }
        st.compute_seconds += Seconds(t0, Clock::now());
        if (!has_output) break;
        if (s.StageOf(to) == r) {
          inputs[{!fwd, a.microbatch, s.ChunkOf(to)}] = std::move(out);  // P = 1: stays here
        } else {
          outputs[{!fwd, a.microbatch, a.chunk}] = std::move(out);
        }
        break;
      }
      case PipeOp::kSendActivation:
      case PipeOp::kSendGrad: {
        std::vector<float> buf;
        if (!take(&outputs, {a.op == PipeOp::kSendGrad, a.microbatch, a.chunk}, &buf)) {
          return Status::Internal(
              fmt::format("pipeline stage {}: {} before its output was computed", r, ToString(a)));
        }
        if (fns.before_transfer) fns.before_transfer();
        comm->Send(buf.data(), n, a.peer);
        st.bytes_sent += static_cast<int64_t>(n * sizeof(float));
        ++st.sends;
        break;
      }
      case PipeOp::kRecvActivation:
      case PipeOp::kRecvGrad: {
        std::vector<float> buf(n);
        if (fns.before_transfer) fns.before_transfer();
        comm->Recv(buf.data(), n, a.peer);
        inputs[{a.op == PipeOp::kRecvGrad, a.microbatch, a.chunk}] = std::move(buf);
        st.bytes_received += static_cast<int64_t>(n * sizeof(float));
        ++st.receives;
        break;
      }
    }
  }
  st.wall_seconds = Seconds(start, Clock::now());
  if (stats != nullptr) *stats = st;
  return Status::OK();
}

}  // namespace keel

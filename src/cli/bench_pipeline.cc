// `keel bench --pipeline`: the pipeline executor's measured bubble against the closed form, on
// ranks as threads (MakeThreadGroup). Each forward sleeps a fixed time per stage divided by the
// chunks V (a chunk holds 1/V of the stage's layers), each backward twice that, so the stages keep
// no core busy and the figure is the schedule's, not the machine's. Also the point-to-point bytes
// per micro-batch boundary against b s h floats.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "cli/commands.h"
#include "cli/exit_code.h"
#include "comm/communicator.h"
#include "core/log.h"
#include "core/status.h"
#include "pipeline/executor.h"
#include "pipeline/schedule.h"

namespace keel::cli {
namespace {

struct Measured {
  double wall_ms = 0, busy_ms = 0;
  int64_t bytes = 0;
};

Measured RunOnce(const PipelineSchedule& sched, double forward_ms, size_t floats) {
  const int P = sched.stages;
  auto comms = MakeThreadGroup(P);
  std::vector<PipelineRunStats> stats(P);
  std::vector<Status> status(P);
  std::vector<std::thread> threads;
  const double chunk_ms = forward_ms / sched.chunks;
  for (int r = 0; r < P; ++r) {
    threads.emplace_back([&, r] {
      auto work = [](double ms) {
        std::this_thread::sleep_until(std::chrono::steady_clock::now() +
                                      std::chrono::microseconds(static_cast<int64_t>(ms * 1e3)));
      };
      StageFunctions f;
      f.activation_floats = floats;
      f.forward = [&](int, int, const float*, float* out) {
        work(chunk_ms);
        if (out != nullptr) out[0] = 1.0f;
      };
      f.backward = [&](int, int, const float*, float* in_grad) {
        work(2 * chunk_ms);
        if (in_grad != nullptr) in_grad[0] = 1.0f;
      };
      comms[r]->Barrier();
      status[r] = RunPipelineSchedule(sched, comms[r].get(), f, &stats[r]);
    });
  }
  for (auto& t : threads) t.join();
  Measured m;
  for (int r = 0; r < P; ++r) {
    KEEL_CHECK(status[r].ok(), status[r].ToString());
    m.wall_ms = std::max(m.wall_ms, 1e3 * stats[r].wall_seconds);
    m.busy_ms = std::max(m.busy_ms, 1e3 * stats[r].compute_seconds);
    m.bytes += stats[r].bytes_sent;
  }
  return m;
}

}  // namespace

int BenchPipeline(int repeats, double forward_ms) {
  struct Case {
    int P, m, V;
  };
  const Case cases[] = {{2, 4, 1}, {2, 8, 1},  {4, 4, 1},  {4, 8, 1},  {4, 16, 1},
                        {4, 8, 2}, {4, 16, 2}, {8, 16, 1}, {8, 16, 2}, {4, 16, 4}};
  const int64_t b = 1, s = 128, h = 256;  // the boundary tensor: b s h floats
  Log("pipeline bubble on ranks as threads: forward {:.1f} ms per stage and micro-batch (/V per "
      "chunk), backward twice that, as sleeps; median of {} runs",
      forward_ms, repeats);
  Log("bubble = (iteration - busiest stage's compute) / iteration; closed form (P-1)/(V m+P-1) "
      "(Narayanan et al. 2021's (p-1)/(v m) of the ideal time, as a share of the iteration)");
  Log("{:>2} {:>3} {:>2} {:>10} {:>10} {:>9} {:>9} {:>9} {:>14} {:>14}", "P", "m", "V", "iter ms",
      "ideal ms", "measured", "simulated", "formula", "p2p B/boundary", "b*s*h*4");
  for (const Case& c : cases) {
    PipelineSchedule sched;
    if (Status st = MakePipelineSchedule(c.P, c.m, c.V, &sched); !st.ok()) return Fail(st);
    PipeSimulation sim;
    if (Status st = SimulateSchedule(sched, PipeCosts{}, &sim); !st.ok()) return Fail(st);
    std::vector<Measured> runs;
    for (int i = 0; i < repeats; ++i) runs.push_back(RunOnce(sched, forward_ms, b * s * h));
    std::sort(runs.begin(), runs.end(),
              [](const Measured& x, const Measured& y) { return x.wall_ms < y.wall_ms; });
    const Measured& med = runs[runs.size() / 2];
    const double formula = (c.P - 1.0) / (c.V * c.m + c.P - 1);
    const int64_t boundaries = 2 * int64_t{c.m} * (c.P * c.V - 1);
    Log("{:>2} {:>3} {:>2} {:>10.1f} {:>10.1f} {:>8.1f}% {:>8.1f}% {:>8.1f}% {:>14} {:>14}", c.P,
        c.m, c.V, med.wall_ms, 3 * forward_ms * c.m,
        100.0 * (med.wall_ms - med.busy_ms) / med.wall_ms, 100.0 * sim.bubble_fraction,
        100.0 * formula, med.bytes / boundaries, b * s * h * 4);
  }
  return 0;
}

}  // namespace keel::cli

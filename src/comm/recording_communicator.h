// RecordingCommunicator: the communicator the training loop talks to. It forwards every
// collective to the real one (MPI, or the single process) and
//   - records it in the flight recorder (comm/collective_recorder.h) that hang dumps print;
//   - checks that the ranks are in step: every host collective (several per iteration) carries a
//     24-byte header — its sequence number, kind, size and the digest of every collective before
//     it — so a rank that skipped, added or resized any collective (the seeds' eval deadlock) is
//     named at the next host collective instead of hanging; with `check_every` (--debug-
//     collectives) the ranks also agree on the header before each gradient collective.
// Ranks out of step cannot continue: every rank logs the same report and the job ends with
// ExitCode::kRanksCannotGoOn, the watchdog's hang exit code.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "comm/collective_recorder.h"
#include "comm/communicator.h"
#include "core/env.h"
#include "core/exit_code.h"

namespace keel {

class RecordingCommunicator : public Communicator {
 public:
  RecordingCommunicator(Communicator* inner, Env* env);
  // A group of this communicator's (Split): owns its inner communicator, has its own recorder
  // and sequence numbers, and is named in hang dumps by `group_name` ("tensor", "data").
  RecordingCommunicator(std::unique_ptr<Communicator> inner, Env* env);

  const std::string& group_name() const { return group_name_; }
  void set_group_name(std::string name) { group_name_ = std::move(name); }

  const CollectiveRecorder& recorder() const { return recorder_; }
  // Its point-to-point transfers (Send "send-to-P", Recv "recv-from-P", P a group rank), kept
  // apart: they differ between the two ends, so they enter no digest.
  const CollectiveRecorder& p2p_recorder() const { return p2p_recorder_; }
  // --debug-collectives: agree on every collective's kind and size before it runs.
  void set_check_every(bool on) { check_every_ = on; }
  // Called (on every rank) with the report before the job ends for collectives out of step:
  // the run journals it.
  void set_on_out_of_step(std::function<void(const std::string&)> f) {
    on_out_of_step_ = std::move(f);
  }
  // TEST-ONLY seam (train/test_hooks.h): true skips the collective about to run, as a buggy rank
  // would (it is neither run nor recorded).
  void set_skip_fault(std::function<bool(const std::string& kind)> f) { skip_ = std::move(f); }
  // TEST-ONLY seam: called inside each Send and Recv (recorded, not yet transferred) with its
  // kind; a hang fault sleeps there, as a rank stuck in a pipeline transfer would.
  void set_p2p_fault(std::function<void(const std::string& kind)> f) { p2p_fault_ = std::move(f); }

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string Describe() const override { return inner_->Describe(); }
  void ReduceScatterSum(float* data, size_t n, size_t begin, size_t end) override;
  void AllGather(float* data, size_t n) override;
  void AllGatherBytes(const std::string& mine, std::vector<std::string>* all) override;
  void AllReduceSumHost(double* data, size_t n) override;
  void AllReduceMaxHost(double* data, size_t n) override;
  Status AgreeOnStatus(const Status& st) override;
  void Send(const float* data, size_t n, int peer) override;
  void Recv(float* data, size_t n, int peer) override;
  // The tensor-parallel products and sequence parallelism's pair: recorded as one collective
  // each and forwarded (the inner communicator's algorithm and bits).
  void AllReduceSum(float* data, size_t n) override;
  void AllReduceMax(float* data, size_t n) override;
  void AllGatherChunks(const float* mine, float* all, size_t chunk) override;
  void ReduceScatterChunks(const float* all, float* mine, size_t chunk) override;
  // The inner communicator's group, wrapped in a RecordingCommunicator of its own (its own
  // flight recorder, sequence numbers and out-of-step check among the group's ranks).
  std::unique_ptr<Communicator> Split(int color, int key) override;
  void Barrier() override;
  [[noreturn]] void Abort(int exit_code) override;

 private:
  struct Header;
  // Records `kind`; false when the test hook skips it.
  bool Skip(const std::string& kind);
  // The header of the collective about to be recorded.
  std::string MakeHeader(const std::string& kind, size_t bytes) const;
  // Compares the ranks' headers; on a difference, ends the job naming who differs.
  void CheckHeaders(const std::vector<std::string>& headers);
  // Agrees on the header of a gradient collective (--debug-collectives).
  void AgreeBeforeData(const std::string& kind, size_t bytes);
  [[noreturn]] void OutOfStep(const std::string& report);

  std::unique_ptr<Communicator> owned_;  // a group's (Split), else null
  Communicator* inner_;
  Env* env_;
  std::string group_name_;
  CollectiveRecorder recorder_;
  CollectiveRecorder p2p_recorder_;
  bool check_every_ = false;
  const char* host_kind_ = nullptr;  // set while a named host collective runs on AllGatherBytes
  bool host_same_size_ = true;       // whether every rank sends the same size in that collective
  std::function<void(const std::string&)> on_out_of_step_;
  std::function<bool(const std::string&)> skip_;
  std::function<void(const std::string&)> p2p_fault_;
};

}  // namespace keel

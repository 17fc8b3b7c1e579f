// Communicator: every reduction the training loop does goes through this interface, so data
// parallelism (MPI on CPU, NCCL on GPU) is a new implementation, not a rewrite of the loop.
//
// Determinism: every sum is taken in rank order (rank 0 + rank 1 + ...) on the rank that owns the
// element, whatever algorithm moves the bytes; so the same world size, data and seed give the same
// bits, and the result does not depend on how a buffer is cut into buckets.
//
// Memory: ReduceScatterSum and AllGather take backend memory (gradients, weights), after the
// caller's Backend::Synchronize(); the MPI communicator reads and writes it as host memory, so it
// pairs with a backend whose memory is host memory (the CPU's), and a device backend needs a
// device-aware one (NCCL). Every other call takes host memory.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "core/shard_range.h"
#include "core/status.h"

namespace keel {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // How this process was launched and where it runs, for the log ("MPI (Open MPI v4.1.4), rank 1
  // of 2 on host a").
  virtual std::string Describe() const = 0;

  // Gradients (backend memory). For elements [begin, end) of a buffer of
  // n floats: the owner of each element (ShardOf(n, ...)) receives every rank's value and stores
  // the sum in rank order; elements this rank does not own keep its own values.
  virtual void ReduceScatterSum(float* data, size_t n, size_t begin, size_t end) = 0;
  // Every rank's shard (ShardOf(n, rank, world)) of `data` (backend memory) copied to every other
  // rank.
  virtual void AllGather(float* data, size_t n) = 0;

  // Host values (losses, norms, counters, file lists): every rank's `mine`, in rank order.
  virtual void AllGatherBytes(const std::string& mine, std::vector<std::string>* all) = 0;
  // In-place sum (in rank order) and maximum over ranks of n host doubles.
  // (Built on AllGatherBytes; virtual so a decorator can name them, comm/recording_communicator.h.)
  virtual void AllReduceSumHost(double* data, size_t n);
  virtual void AllReduceMaxHost(double* data, size_t n);
  // Whether every rank's `st` is OK; else the first failing rank's error, naming the rank.
  virtual Status AgreeOnStatus(const Status& st);
  virtual void Barrier() = 0;

  // ---- model parallelism (tensor and pipeline groups, comm/process_mesh.h) ----------------
  // In-place sum over the ranks of n floats of backend memory: every rank gets the same bits, the
  // sum taken in rank order (a reduce-scatter then an all-gather), so the tensor-parallel forward
  // and backward are deterministic. The default is built on ReduceScatterSum and AllGather.
  virtual void AllReduceSum(float* data, size_t n);
  // In-place element-wise maximum over the ranks (the vocabulary-parallel cross-entropy's row
  // maximum); NaN wins, as in AllReduceMaxHost. The default is built on AllGatherBytes.
  virtual void AllReduceMax(float* data, size_t n);
  // Sequence parallelism's pair (backend memory, equal chunks in rank order): AllGatherChunks
  // copies every rank's `chunk` floats at `mine` to all[rank * chunk ...]; ReduceScatterChunks
  // sums `all` (world * chunk floats) over the ranks in rank order and leaves this rank's chunk
  // of the sum in `mine`. The defaults are built on AllGatherBytes.
  virtual void AllGatherChunks(const float* mine, float* all, size_t chunk);
  virtual void ReduceScatterChunks(const float* all, float* mine, size_t chunk);
  // Blocking point to point of n floats of backend memory (pipeline activations and gradients).
  // Each Send is matched by one Recv on `peer` with the same n, in issue order.
  virtual void Send(const float* data, size_t n, int peer);
  virtual void Recv(float* data, size_t n, int peer);
  // MPI_Comm_split: a communicator of the ranks that passed the same `color`, ranked by `key`
  // (ties by rank). Every rank calls it, in the same order as every other collective.
  virtual std::unique_ptr<Communicator> Split(int color, int key);

  // Ends every rank of the job at once with `exit_code` (a failed rank must not leave the others
  // waiting in a collective). Does not return.
  [[noreturn]] virtual void Abort(int exit_code) = 0;
};

// "rank 1" or "ranks 0,2", for messages that name ranks.
std::string DescribeRanks(const std::vector<int>& ranks);

// One process, world size 1: every reduction is the identity.
std::unique_ptr<Communicator> MakeSingleProcessCommunicator();

// `n` ranks as threads of one process (comm/thread_group.cc), each communicator to be used by its
// own thread: the many-rank code of the model (tensor and pipeline parallelism) is tested in
// process, without mpirun. Abort ends the process.
std::vector<std::unique_ptr<Communicator>> MakeThreadGroup(int n);

}  // namespace keel

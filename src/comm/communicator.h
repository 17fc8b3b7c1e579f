// Communicator: every reduction the training loop does goes through this interface, so data
// parallelism (MPI on CPU, NCCL on GPU) is a new implementation, not a rewrite of the loop.
// Reductions are in a fixed order so results are deterministic.
#pragma once

#include <cstddef>
#include <memory>

namespace keel {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // In-place sum over ranks of n floats in backend memory (gradients).
  virtual void AllReduceSum(float* data, size_t n) = 0;
  // In-place sum over ranks of n doubles in host memory (losses, norms, counters).
  virtual void AllReduceSumHost(double* data, size_t n) = 0;
  virtual void Barrier() = 0;
};

// One process, world size 1: every reduction is the identity.
std::unique_ptr<Communicator> MakeSingleProcessCommunicator();

}  // namespace keel

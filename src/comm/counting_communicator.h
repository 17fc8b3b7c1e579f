// CountingCommunicator: forwards everything to another communicator and counts the bytes this
// rank sends, per kind of transfer, for `keel bench parallel` and tests that check a layout's
// traffic against the Megatron-LM papers' counts. The bytes charged per call are what this rank
// puts on the wire in keel's MPI communicator (comm/mpi_communicator.cc), which the thread group
// mirrors in volume:
//   reduce-scatter (MPI_Alltoallv): the elements of [begin, end) other ranks own;
//   all-gather (MPI_Allgatherv): this rank's shard, once to each other rank;
//   all-gather-chunks / reduce-scatter-chunks (MPI_Allgather / MPI_Alltoall): `chunk` floats to
//     each other rank;
//   all-gather-bytes: this rank's string to each other rank;
//   send: the message.
// AllReduceSum, AllReduceMax and the host reductions are not forwarded whole: they run the base
// class's composition (reduce-scatter + all-gather, the ring's 2 (n-1)/n volume; an all-gather of
// bytes), which is what keel's MPI and thread communicators run too, so they are counted through
// their parts. Not thread safe: one thread per rank, as every communicator.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace keel {

class CountingCommunicator : public Communicator {
 public:
  struct Count {
    int64_t calls = 0;
    int64_t bytes = 0;  // sent by this rank
  };

  explicit CountingCommunicator(Communicator* inner) : inner_(inner) {}

  // Per kind ("reduce-scatter", "all-gather", "all-gather-chunks", "reduce-scatter-chunks",
  // "all-gather-bytes", "send"): calls and bytes sent since the last Reset.
  const std::map<std::string, Count>& counts() const { return counts_; }
  int64_t bytes_sent() const;
  // The sizes (floats) of the point-to-point messages sent, in order.
  const std::vector<size_t>& sends() const { return sends_; }
  void Reset();

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string Describe() const override { return inner_->Describe(); }
  void ReduceScatterSum(float* data, size_t n, size_t begin, size_t end) override;
  void AllGather(float* data, size_t n) override;
  void AllGatherBytes(const std::string& mine, std::vector<std::string>* all) override;
  void AllGatherChunks(const float* mine, float* all, size_t chunk) override;
  void ReduceScatterChunks(const float* all, float* mine, size_t chunk) override;
  void Send(const float* data, size_t n, int peer) override;
  void Recv(float* data, size_t n, int peer) override { inner_->Recv(data, n, peer); }
  // The group itself, not counted (count it with its own wrapper).
  std::unique_ptr<Communicator> Split(int color, int key) override {
    return inner_->Split(color, key);
  }
  void Barrier() override { inner_->Barrier(); }
  [[noreturn]] void Abort(int exit_code) override;

 private:
  void Add(const char* kind, int64_t bytes);

  Communicator* inner_;
  std::map<std::string, Count> counts_;
  std::vector<size_t> sends_;
};

}  // namespace keel

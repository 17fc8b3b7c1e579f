#include "comm/mpi_communicator.h"

#include <fmt/format.h>
#ifndef KEEL_NO_MPI
#include <mpi.h>
#endif
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <vector>

#include "core/exit_code.h"
#include "core/log.h"

namespace keel {
namespace {

int EnvInt(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? 0 : std::atoi(v);
}

#ifndef KEEL_NO_MPI
class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator(std::string launcher, int rank, int size, std::string version)
      : launcher_(std::move(launcher)), rank_(rank), size_(size), version_(std::move(version)) {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    host_ = host;
  }
  // A sub-communicator of `parent` (Split): it frees its MPI_Comm and leaves MPI running.
  MpiCommunicator(const MpiCommunicator& parent, MPI_Comm comm, int rank, int size)
      : launcher_(parent.launcher_),
        rank_(rank),
        size_(size),
        version_(parent.version_),
        host_(parent.host_),
        comm_(comm),
        world_rank_(parent.world_rank_),
        owns_mpi_(false) {}
  ~MpiCommunicator() override {
    if (!owns_mpi_) {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Comm_free(&comm_);
      return;
    }
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  std::string Describe() const override {
    if (!owns_mpi_)
      return fmt::format("MPI group, rank {} of {} (world rank {} on host {})", rank_, size_,
                         world_rank_, host_);
    return fmt::format("MPI ({}, launched by {}), rank {} of {} on host {}", version_, launcher_,
                       rank_, size_, host_);
  }

  void Send(const float* data, size_t n, int peer) override {
    Check(MPI_Send(data, Count(n), MPI_FLOAT, peer, kPointToPointTag, comm_), "MPI_Send");
  }
  void Recv(float* data, size_t n, int peer) override {
    Check(MPI_Recv(data, Count(n), MPI_FLOAT, peer, kPointToPointTag, comm_, MPI_STATUS_IGNORE),
          "MPI_Recv");
  }
  std::unique_ptr<Communicator> Split(int color, int key) override {
    MPI_Comm sub = MPI_COMM_NULL;
    Check(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split");
    int rank = 0, size = 1;
    MPI_Comm_rank(sub, &rank);
    MPI_Comm_size(sub, &size);
    return std::make_unique<MpiCommunicator>(*this, sub, rank, size);
  }

  void ReduceScatterSum(float* data, size_t n, size_t begin, size_t end) override {
    if (begin >= end) return;
    // Rank j receives the part of [begin, end) it owns from every rank, then sums in rank order.
    std::vector<int> send_counts(size_), send_displs(size_), recv_counts(size_), recv_displs(size_);
    ShardRange mine{0, 0};
    for (int j = 0; j < size_; ++j) {
      const ShardRange s = Clip(ShardOf(n, j, size_), begin, end);
      send_counts[j] = Count(s.size());
      send_displs[j] = Count(s.begin - begin);
      if (j == rank_) mine = s;
    }
    const size_t len = mine.size();
    for (int i = 0; i < size_; ++i) {
      recv_counts[i] = Count(len);
      recv_displs[i] = Count(len * i);
    }
    recv_.resize(len * size_);
    Check(MPI_Alltoallv(data + begin, send_counts.data(), send_displs.data(), MPI_FLOAT,
                        recv_.data(), recv_counts.data(), recv_displs.data(), MPI_FLOAT, comm_),
          "MPI_Alltoallv");
    float* out = data + mine.begin;
    const float* r = recv_.data();
    for (size_t k = 0; k < len; ++k) out[k] = r[k];
    for (int i = 1; i < size_; ++i) {
      const float* ri = r + len * i;
      for (size_t k = 0; k < len; ++k) out[k] += ri[k];
    }
  }

  void AllGather(float* data, size_t n) override {
    std::vector<int> counts(size_), displs(size_);
    for (int j = 0; j < size_; ++j) {
      const ShardRange s = ShardOf(n, j, size_);
      counts[j] = Count(s.size());
      displs[j] = Count(s.begin);
    }
    Check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, counts.data(), displs.data(),
                         MPI_FLOAT, comm_),
          "MPI_Allgatherv");
  }

  // Sequence parallelism's pair: equal chunks, so plain Alltoall and Allgather (each rank sends
  // and receives world * chunk floats, the ring's volume), the sum in rank order as above.
  void ReduceScatterChunks(const float* all, float* mine, size_t chunk) override {
    recv_.resize(chunk * size_);
    Check(MPI_Alltoall(all, Count(chunk), MPI_FLOAT, recv_.data(), Count(chunk), MPI_FLOAT, comm_),
          "MPI_Alltoall");
    const float* r = recv_.data();
    for (size_t k = 0; k < chunk; ++k) mine[k] = r[k];
    for (int i = 1; i < size_; ++i) {
      const float* ri = r + chunk * i;
      for (size_t k = 0; k < chunk; ++k) mine[k] += ri[k];
    }
  }

  void AllGatherChunks(const float* mine, float* all, size_t chunk) override {
    Check(MPI_Allgather(mine, Count(chunk), MPI_FLOAT, all, Count(chunk), MPI_FLOAT, comm_),
          "MPI_Allgather");
  }

  void AllGatherBytes(const std::string& mine, std::vector<std::string>* all) override {
    long long len = static_cast<long long>(mine.size());
    std::vector<long long> lens(size_);
    Check(MPI_Allgather(&len, 1, MPI_LONG_LONG, lens.data(), 1, MPI_LONG_LONG, comm_),
          "MPI_Allgather");
    std::vector<int> counts(size_), displs(size_);
    size_t total = 0;
    for (int j = 0; j < size_; ++j) {
      counts[j] = Count(static_cast<size_t>(lens[j]));
      displs[j] = Count(total);
      total += static_cast<size_t>(lens[j]);
    }
    std::string buf(total, '\0');
    Check(MPI_Allgatherv(mine.data(), Count(mine.size()), MPI_CHAR, buf.data(), counts.data(),
                         displs.data(), MPI_CHAR, comm_),
          "MPI_Allgatherv");
    all->resize(size_);
    for (int j = 0; j < size_; ++j) (*all)[j] = buf.substr(displs[j], counts[j]);
  }

  void Barrier() override { Check(MPI_Barrier(comm_), "MPI_Barrier"); }

  [[noreturn]] void Abort(int exit_code) override {
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::_Exit(exit_code);
  }

 private:
  static ShardRange Clip(ShardRange s, size_t begin, size_t end) {
    s.begin = std::max(s.begin, begin);
    s.end = std::max(s.begin, std::min(s.end, end));
    return s;
  }
  // MPI counts are ints: buffers are cut into buckets far below 2^31 elements; a shard that is
  // not (an all-gather of over 8 GB of fp32 per rank) stops the run with a message.
  int Count(size_t v) const {
    KEEL_CHECK(v <= static_cast<size_t>(INT_MAX),
               "a single MPI transfer of more than 2^31 elements (a model of over 2^31 parameters "
               "per rank's shard) is not supported yet");
    return static_cast<int>(v);
  }
  // MPI_ERRORS_ARE_FATAL is the default: a failed call aborts the job; this catches the rest.
  void Check(int rc, const char* what) {
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING] = {0};
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    LogError(fmt::format("error: rank {}: {} failed: {}; aborting every rank", rank_, what, msg));
    Abort(ToInt(ExitCode::kRuntimeFailure));
  }

  static constexpr int kPointToPointTag = 17;
  std::string launcher_;
  int rank_, size_;
  std::string version_;
  std::string host_;
  MPI_Comm comm_ = MPI_COMM_WORLD;
  int world_rank_ = rank_;
  bool owns_mpi_ = true;  // the world communicator finalizes MPI; a group frees its MPI_Comm
  std::vector<float> recv_;
};

#endif  // KEEL_NO_MPI

}  // namespace

std::string DetectMpiLauncher(int* expected_size) {
  *expected_size = 0;
  if (const int n = EnvInt("OMPI_COMM_WORLD_SIZE"); n > 0) {
    *expected_size = n;
    return "mpirun";
  }
  if (const int n = EnvInt("SLURM_STEP_NUM_TASKS"); n > 1) {
    *expected_size = n;
    return "srun";
  }
  if (std::getenv("PMIX_RANK") != nullptr || std::getenv("PMI_RANK") != nullptr) {
    *expected_size = EnvInt("PMI_SIZE");
    return "a PMI launcher";
  }
  return "";
}

#ifdef KEEL_NO_MPI
// A build without MPI (-DKEEL_MPI=OFF: the GPU machine's profile, scripts/device-check.sh) runs
// one process; a launcher's environment is refused instead of starting N separate runs.
Status MakeMpiCommunicator(const std::string& launcher, int expected_size,
                           std::unique_ptr<Communicator>* out) {
  return Status::InvalidArgument(fmt::format(
      "{} started this process, but this keel was built without MPI (-DKEEL_MPI=OFF): run it "
      "without a launcher, or rebuild with -DKEEL_MPI=ON for data parallelism",
      launcher));
}
#else
Status MakeMpiCommunicator(const std::string& launcher, int expected_size,
                           std::unique_ptr<Communicator>* out) {
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  char version[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int vlen = 0;
  MPI_Get_library_version(version, &vlen);
  std::string v(version, vlen);
  if (const size_t comma = v.find(','); comma != std::string::npos) v.resize(comma);
  auto comm = std::make_unique<MpiCommunicator>(launcher, rank, size, v);
  if (expected_size > 0 && size != expected_size)
    return Status::InvalidArgument(fmt::format(
        "{} started {} tasks but MPI sees a world of {}: the tasks would train separately and "
        "overwrite each other's --save. With srun, pass --mpi=pmix (or the MPI plugin your "
        "cluster's Open MPI was built with; `srun --mpi=list` lists them)",
        launcher, expected_size, size));
  if (provided < MPI_THREAD_SERIALIZED)
    return Status::InvalidArgument(
        fmt::format("this MPI library gives thread level {} but keel needs "
                    "MPI_THREAD_SERIALIZED ({}): use an MPI built with thread support (Debian's "
                    "Open MPI is)",
                    provided, MPI_THREAD_SERIALIZED));
  *out = std::move(comm);
  return Status::OK();
}
#endif  // KEEL_NO_MPI

Status MakeCommunicatorFromEnvironment(std::unique_ptr<Communicator>* out) {
  int expected = 0;
  const std::string launcher = DetectMpiLauncher(&expected);
  if (launcher.empty()) {
    *out = MakeSingleProcessCommunicator();
    return Status::OK();
  }
  return MakeMpiCommunicator(launcher, expected, out);
}

}  // namespace keel

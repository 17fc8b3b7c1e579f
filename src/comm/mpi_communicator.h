// The MPI communicator: data parallelism across processes and machines, launched the way HPC
// jobs are (`mpirun -np 4 keel train ...`, `srun keel train ...`). keel decides from the
// launcher's environment whether it runs under MPI at all: a plain `keel train` never initialises
// MPI. The sums are keel's own (communicator.h: in rank order on the owning rank); MPI only moves
// the bytes (Alltoallv for the reduce-scatter, Allgatherv for the all-gather), so the bits do not
// depend on which collective algorithm Open MPI picks.
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"
#include "core/status.h"

namespace keel {

// The launcher this process was started by, from its environment: "mpirun" (Open MPI's
// OMPI_COMM_WORLD_SIZE), "srun" (SLURM_STEP_NUM_TASKS > 1 or PMIx/PMI variables), or "" (none).
// `expected_size` gets the world size the launcher announced (0 when it does not say).
std::string DetectMpiLauncher(int* expected_size);

// Initialises MPI (threads: MPI_THREAD_SERIALIZED, so the gradient reducer's thread may talk while
// the main thread computes) and wraps MPI_COMM_WORLD. InvalidArgument when the world MPI reports
// is not the one the launcher announced (e.g. srun without --mpi=pmix starts N one-rank worlds
// that would all write the same --save). MPI is finalised when the communicator is destroyed.
Status MakeMpiCommunicator(const std::string& launcher, int expected_size,
                           std::unique_ptr<Communicator>* out);

// The communicator of this process: MPI when a launcher started it, else a single process
// (Describe() says which).
Status MakeCommunicatorFromEnvironment(std::unique_ptr<Communicator>* out);

}  // namespace keel

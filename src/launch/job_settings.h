// What keel launch needs of its job's keel train settings: the tensor x pipeline layout and the
// batch sizes, to shrink the job by whole model replicas (--elastic), and the run's last
// iteration, to see a job finished. Read as keel train reads them (config/config.h's
// ReadTrainArgs: the --config TOML under the flags), never by a second parser.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace keel {

struct JobSettings {
  int tensor = 1, pipeline = 1;           // model parallel sizes: a replica is their product
  int global_batch = 0, micro_batch = 0;  // 0: not known, or (global) derived by keel
  int64_t train_iters = -1;               // the run's last iteration; -1: not known
  std::string source;                     // where they came from, for messages
  int ModelParallel() const { return tensor * pipeline; }
};

// The settings of the command's keel train (hosts.h: CommandTrainArgs); without a keel train in
// sight (a wrapper script), what the command's own flags say. InvalidArgument, naming the problem,
// when keel train's arguments cannot be read (an unreadable --config, bad TOML): the job would
// fail the same way. `ranks` (-1: not known) resolves the iteration count of a --train-samples run.
Status ReadJobSettings(const std::vector<std::string>& command, int ranks, JobSettings* out);

}  // namespace keel

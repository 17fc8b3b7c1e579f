#include "launch/job_settings.h"

#include <fmt/format.h>

#include <cstdint>
#include <cstdlib>

#include "config/config.h"
#include "launch/hosts.h"
#include "optim/batch_rampup.h"

namespace keel {
namespace {

// The flag's value as a positive number; 0 when absent or not one.
int64_t FlagNumber(const std::vector<std::string>& command, const std::string& flag) {
  const std::string v = CommandFlagValue(command, flag);
  char* end = nullptr;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  return !v.empty() && *end == '\0' && n > 0 && n <= INT32_MAX ? n : 0;
}

}  // namespace

Status ReadJobSettings(const std::vector<std::string>& command, int ranks, JobSettings* out) {
  *out = JobSettings();
  const std::vector<std::string> args = CommandTrainArgs(command);
  if (args.empty()) {
    // A wrapper: its flags, if it passes keel train's on (1 and "not known" when absent).
    out->source = "the command's flags (no keel train in it)";
    out->tensor = CommandModelParallelSize(command);
    out->global_batch = static_cast<int>(FlagNumber(command, "--global-batch-size"));
    out->micro_batch = static_cast<int>(FlagNumber(command, "--micro-batch-size"));
    const int64_t iters = FlagNumber(command, "--train-iters");
    out->train_iters = iters > 0 ? iters : -1;
    return Status::OK();
  }
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  ParsedConfig parsed;
  if (Status st = ReadTrainArgs(static_cast<int>(argv.size()), argv.data(), &parsed); !st.ok())
    return Status::InvalidArgument(fmt::format(
        "cannot read the job's keel train settings: {}; launch reads its tensor and pipeline "
        "parallel sizes, batch sizes and length from them as keel train does (--config under "
        "the flags), and the job would fail the same way: fix the command",
        st.message()));
  const TrainConfig& c = parsed.config;
  const std::string config = CommandFlagValue(args, "--config");
  out->source = config.empty() ? "keel train's flags"
                               : fmt::format("keel train's --config {} and flags", config);
  out->tensor = c.tensor_model_parallel_size;
  out->pipeline = c.pipeline_model_parallel_size;
  out->global_batch = c.global_batch_size;
  out->micro_batch = c.micro_batch_size;
  if (c.train_iters > 0) {
    out->train_iters = c.train_iters;
  } else {
    // A --train-samples run's length depends on the global batch (and its ramp-up): Validate
    // resolves them. --threads is the ranks' business, not this host's: left out of the check.
    TrainConfig v = c;
    v.threads = 0;
    const int mp = out->ModelParallel();
    if (ranks > 0 && mp > 0 && ranks % mp == 0) v.data_parallel_size = ranks / mp;
    std::vector<std::string> notes;
    if (Validate(&v, &notes).ok()) out->train_iters = TotalTrainIters(v);
  }
  return Status::OK();
}

}  // namespace keel

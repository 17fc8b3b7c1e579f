// keel: pretrain GPT-style language models that stay upright.
#include <cstdio>
#include <cstring>
#include <new>
#include <string>

#include "cli/commands.h"
#include "core/log.h"
#include "core/status.h"

namespace {

constexpr const char* kUsage = R"(keel )" KEEL_VERSION R"( - pretrain GPT-style language models

usage: keel <command> [options]

commands:
  train          train a model (Megatron-LM flags or --config run.toml); no flags: the default job
  launch         run a job (mpirun/srun ... keel train) and restart it when it fails or hangs
  sample         generate text from a checkpoint of `keel train --save DIR`
  data           prepare (tokenize text into .bin/.idx), inspect and verify datasets
  ckpt           list, inspect, verify, diff, edit, pin, export (HF) and import (HF) checkpoints
  logs           analyze Megatron-LM / DeepSpeed / keel training logs, convert them, watch live ones
  report         one self-contained HTML page of a run: curves, events marked, its chronicle
  plan           parameters, memory per GPU, feasible batch ramp-up and days for a model and layout
  tb             rename tags in TensorBoard event files, truncate them after a step
  hangs          analyze the watchdog's hang dumps: which ranks were where, the odd ones out
  goodput        where every second of a job went: productive, lost, saves, hangs, restarts, ...
  bench          measure tokens/s, GFLOP/s and MFU against this machine's sgemm peak
  version        print the version

`keel <command> --help` describes each command's options.
)";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
      !std::strcmp(argv[1], "help")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  const char* const* sub = argv + 1;
  const int subc = argc - 1;
  try {
    if (cmd == "train") return keel::cli::TrainCommand(subc, sub);
    if (cmd == "launch") return keel::cli::LaunchCommand(subc, sub);
    if (cmd == "sample") return keel::cli::SampleCommand(subc, sub);
    if (cmd == "data") return keel::cli::DataCommand(subc, sub);
    if (cmd == "bench") return keel::cli::BenchCommand(subc, sub);
    if (cmd == "ckpt") return keel::cli::CkptCommand(subc, sub);
    if (cmd == "logs") return keel::cli::LogsCommand(subc, sub);
    if (cmd == "report") return keel::cli::ReportCommand(subc, sub);
    if (cmd == "plan") return keel::cli::PlanCommand(subc, sub);
    if (cmd == "tb") return keel::cli::TbCommand(subc, sub);
    if (cmd == "hangs") return keel::cli::HangsCommand(subc, sub);
    if (cmd == "goodput") return keel::cli::GoodputCommand(subc, sub);
    if (cmd == "version" || cmd == "--version") {
      std::printf("keel %s\n", KEEL_VERSION);
      return 0;
    }
  } catch (const std::bad_alloc&) {
    // TrainingRun reports its own with what it was doing; this is any other command's.
    keel::LogError("error: out of memory while running `keel " + cmd +
                   "`: free memory on this machine, or give the command less to hold (for "
                   "`keel train`: reduce --micro-batch-size, --seq-length, --num-layers or "
                   "--hidden-size)");
    return 1;
  } catch (const keel::KeelError& e) {
    keel::LogError(std::string("error: ") + e.what());
    return 1;
  } catch (const std::exception& e) {
    keel::LogError(std::string("error: ") + e.what());
    return 1;
  }
  keel::LogError("error: unknown command '" + cmd + "'; run `keel --help` for the list");
  return 2;
}

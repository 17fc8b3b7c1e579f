// keel's subcommands. Each takes the arguments after its name (argv[0] is the subcommand) and
// returns the process exit code: 0 success, 1 a runtime failure, 2 a usage or configuration error.
#pragma once

#include <string>

namespace keel::cli {

int TrainCommand(int argc, const char* const* argv);
int SampleCommand(int argc, const char* const* argv);
int DataCommand(int argc, const char* const* argv);
int BenchCommand(int argc, const char* const* argv);
// `keel bench level-shift` (bench_level_shift.cc): the throughput-drop detector's delay against a
// slowdown's size and the noise, and its false drops on healthy series; argv[0] is "level-shift".
int BenchLevelShift(int argc, const char* const* argv);
// `keel bench --checkpoint` (bench_checkpoint.cc): repeats, threads.
int BenchCheckpoint(const std::string& dir, int repeats, int threads);
// `keel bench --guard` (bench_guard.cc): the guard's cost per step, median of paired ratios.
int BenchGuard(int iters, int warmup, int threads);
// `keel bench log-detectors` (bench_log_detectors.cc); argv[0] is "log-detectors".
int BenchLogDetectors(int argc, const char* const* argv);
// `keel bench --recompute`: step time and activation memory of each recomputation granularity.
int BenchRecompute(int iters, int warmup, int threads, int seq_length);
// `keel bench --data` (bench_data.cc): sampler tokens/s on a synthetic dataset of `gb` GB.
int BenchData(const std::string& dir, double gb, int repeats, int seq_length);
// `keel bench --pipeline` (bench_pipeline.cc): the executor's bubble against (P-1)/(V m+P-1).
int BenchPipeline(int repeats, double forward_ms);
// `keel bench parallel` (bench_parallel.cc): bytes per rank of tensor and pipeline layouts on the
// real model against the analytic counts, and the real stages' bubble; argv[0] is "parallel".
int BenchParallel(int argc, const char* const* argv);
// `keel ckpt list|inspect|verify|diff|edit|pin|unpin|export|import` (ckpt_cmd.cc).
int CkptCommand(int argc, const char* const* argv);
int TbCommand(int argc, const char* const* argv);
// `keel logs analyze` (logs_cmd.cc).
int LogsCommand(int argc, const char* const* argv);
// `keel report RUN_DIR` (report_cmd.cc).
int ReportCommand(int argc, const char* const* argv);
// `keel launch [options] -- COMMAND ARGS...` (launch_cmd.cc): run a job, restart it on failure.
int LaunchCommand(int argc, const char* const* argv);
// `keel hangs analyze DIR` (hangs_cmd.cc): the watchdog's per-rank dumps of one hang, grouped.
int HangsCommand(int argc, const char* const* argv);
// `keel goodput RUN [--json]` (goodput_cmd.cc): where every second of a job went.
int GoodputCommand(int argc, const char* const* argv);
// Appends the job's goodput so far to RUN's journal and chronicle (the end of a run or of
// keel launch); nothing when RUN holds no goodput records. `who` prefixes the logged sentence.
void JournalGoodputSummary(const std::string& run_dir, const std::string& who);
// `keel plan` (plan_cmd.cc): the cost of a model and layout before launching it.
int PlanCommand(int argc, const char* const* argv);
// `keel ckpt export PATH --hf OUT` (ckpt_export_cmd.cc); argv[0] is "export".
int CkptExportCommand(int argc, const char* const* argv);
// `keel ckpt import --hf DIR --save OUT` (ckpt_import_cmd.cc); argv[0] is "import".
int CkptImportCommand(int argc, const char* const* argv);

}  // namespace keel::cli

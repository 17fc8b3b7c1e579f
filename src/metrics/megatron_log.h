// MegatronLogParser: the iteration and validation lines of Megatron-LM / Megatron-DeepSpeed
// training logs (and keel's, which prints the same line), as they come off a cluster:
//   - any prefix before "iteration N/ TOTAL |": timestamps ("[2022-05-01 03:56:11]"), launcher
//     rank tags ("[default7]:"), hostnames
//   - lines wrapped by a terminal: a record runs until a line ends with "|"; field names are
//     matched without whitespace and values have it removed, so a break inside a word or number
//     reads the same
//   - elapsed time in ms or s; "nan"/"inf" values
//   - process starts ("using world size", "loaded checkpoint") noted so restarts are seen even when
//     the iteration does not go backwards
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace keel {

struct LogRecord {
  int64_t iteration = 0;
  int64_t train_iters = 0;  // "/ TOTAL" (0: not printed)
  int64_t consumed_samples = -1, consumed_tokens = -1;
  double iteration_seconds = NAN, learning_rate = NAN, global_batch = NAN, lm_loss = NAN;
  double loss_scale = NAN, grad_norm = NAN, num_zeros = NAN, samples_per_second = NAN;
  double tflops = NAN;
  int64_t skipped = 0, nan = 0;  // iterations of this log interval
  bool nonfinite = false;        // a "nan"/"inf" loss or gradient norm
  bool after_start = false;      // a process start was logged since the previous record
  std::string timestamp;         // "[...]" date prefix of the line, if any
  std::string file;
  int line = 0;
};

struct LogValidation {
  int64_t iteration = 0;
  double lm_loss = NAN, ppl = NAN;
  size_t records_before = 0;  // iteration records that precede it in the log (for merging)
  std::string file;
  int line = 0;
};

struct ParsedLog {
  std::vector<LogRecord> records;  // in file order (restarts make iterations go back)
  std::vector<LogValidation> validations;
  std::vector<std::string> files;
  int64_t lines = 0;
  int64_t wrapped = 0;  // records that were joined from more than one line
};

// Appends the records of one file's text; other lines are ignored. A file without any iteration
// line is not an error here (the caller says so).
Status ParseMegatronLog(const std::string& text, const std::string& file, ParsedLog* out);

}  // namespace keel

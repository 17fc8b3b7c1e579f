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
#include <string_view>
#include <vector>

#include "core/env.h"
#include "core/status.h"

namespace keel {

// Iteration numbers and counts above this are refused: no run comes near it, and beyond it a
// double (JSON readers, the report's charts) no longer holds every integer.
constexpr int64_t kMaxLogCount = int64_t{1} << 53;

struct LogRecord {
  int64_t iteration = 0;
  int64_t train_iters = 0;  // "/ TOTAL" (0: not printed)
  int64_t consumed_samples = -1, consumed_tokens = -1;
  double iteration_seconds = NAN, learning_rate = NAN, global_batch = NAN, lm_loss = NAN;
  double loss_scale = NAN, grad_norm = NAN, num_zeros = NAN, samples_per_second = NAN;
  double tflops = NAN;
  int64_t skipped = 0, nan = 0;  // iterations of this log interval
  bool has_loss = false;         // the line printed an "lm loss" field
  bool has_nan_count = false;    // ... a "number of nan iterations" field
  // A non-finite iteration in this interval: "number of nan iterations" > 0, or, on a line
  // without that counter, a "nan"/"inf" loss or grad norm. A skipped iteration (the counter
  // says skipped > 0, nan 0: a data window skipped after a rollback, an fp16 overflow) is not.
  bool nonfinite = false;
  // No iteration of this interval was trained: it has skipped iterations and no "lm loss" (keel,
  // Megatron omit it then), or as many skipped iterations as the interval has. Its loss and
  // throughput are gaps, not values.
  bool gap = false;
  bool after_start = false;  // a process start was logged since the previous record
  std::string timestamp;     // "[...]" date prefix of the line, if any
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

// An iteration or validation line that was read but refused: an impossible number.
struct RejectedLine {
  std::string file;
  int line = 0;
  std::string reason;
};

struct ParsedLog {
  std::vector<LogRecord> records;  // in file order (restarts make iterations go back)
  std::vector<LogValidation> validations;
  std::vector<RejectedLine> rejected;
  std::vector<std::string> files;
  int64_t lines = 0;
  int64_t wrapped = 0;  // records that were joined from more than one line
};

// Appends the records of one file's text; other lines are ignored. A line whose numbers cannot be
// true (an iteration or count beyond kMaxLogCount or negative, a negative time or throughput) is
// not a record but a RejectedLine. A file without any iteration line is not an error here (the
// caller says so).
Status ParseMegatronLog(const std::string& text, const std::string& file, ParsedLog* out);

// A line longer than this is no log line (a file without newlines, binary data): only its first
// kMaxLogLineBytes are parsed (MegatronLogParser::AddLine cuts it).
constexpr size_t kMaxLogLineBytes = size_t{1} << 20;

// ParseMegatronLog of the file `path`, streamed: read in pieces (Env::ReadFileRange) and parsed a
// line at a time, so memory grows with the records found, not with the file, and no line takes
// more than kMaxLogLineBytes. Only a regular file: a FIFO, device or socket is refused by name
// without being opened (InvalidArgument, as is a directory); NotFound when there is no file.
Status ReadMegatronLog(Env* env, const std::string& path, ParsedLog* out);

// The same parser, a line at a time, for a log that is still being written (`keel logs watch`):
// ParseMegatronLog is BeginFile, AddLine for every line, Flush. A record waits for its
// continuation lines until a line ends it (one ending in "|", a new record, a validation line, an
// empty line); Flush ends the one still waiting. The caller may take records, validations and
// rejected lines out of `out` as they arrive: the parser keeps what it needs of the past itself.
class MegatronLogParser {
 public:
  explicit MegatronLogParser(ParsedLog* out) : out_(out) {}

  // A new file of the run: line numbers restart, and a record cannot continue across it.
  void BeginFile(const std::string& file);
  // The same stream continued in a new file (a rotated log): line numbers restart under `file`,
  // a process start seen just before still counts.
  void ContinueInFile(const std::string& file);
  // One line, without its "\n" (a trailing "\r" is dropped).
  void AddLine(std::string_view line);
  // End of input (or of patience): the record waiting for continuation lines is parsed as it is.
  void Flush();
  bool waiting() const { return pending_.active; }

 private:
  struct Pending {
    bool active = false, validation = false, joined = false;
    int continuations = 0, line = 0;
    std::string text, timestamp;
  };
  void Complete();

  ParsedLog* out_;
  std::string file_;
  int line_ = 0;
  bool started_ = false;  // a process start since the last record
  bool has_prev_ = false;
  int64_t prev_iteration_ = 0;
  size_t records_ = 0;  // records parsed so far (validations are placed after them)
  Pending pending_;
};

}  // namespace keel

// The parser API of TrainConfig (config/train_config.h): `keel train` flags and TOML files (same
// keys; flags given on the command line override the file), validation with derived defaults, and
// the resolved config as text and hash. One settings table drives all of them (config_settings.cc).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "config/train_config.h"
#include "core/status.h"

namespace keel {

// The most CPU threads a command may run: 4 per hardware thread (std::thread::hardware_concurrency,
// at least 1), and never more than 1024. Far more threads than cores only slow OpenMP down, and
// thousands of them hang or crash it.
int MaxThreads();
// `--threads N` of any command: 0 (all cores) up to MaxThreads(), or an error naming the limit.
Status ValidateThreads(int threads);

// Parses "A-B" (inclusive, 1 <= A <= B) ranges of --skip-train-iteration-range.
Status ParseIterationRanges(const std::vector<std::string>& text,
                            std::vector<std::pair<int64_t, int64_t>>* out);
// Parses "A-B" (inclusive, 0 <= A <= B) ranges of --skip-train-samples-range.
Status ParseSampleRanges(const std::vector<std::string>& text,
                         std::vector<std::pair<int64_t, int64_t>>* out);

// The outcome of parsing: a config, or an error naming the flag, the value, the rule and a fix.
// `notes` collects the choices keel made on the user's behalf (e.g. FFN size defaulted to 4h);
// the caller prints them.
struct ParsedConfig {
  TrainConfig config;
  std::vector<std::string> notes;
  // The config as given, before Validate filled derived values (global batch, FFN size, ...). When
  // the data-parallel size is known and > 1, set it on a copy of this and Validate that copy.
  TrainConfig as_given;
  // What keel made of the flags and files it was given, printed as notes before the run: the
  // Megatron spellings it read as its own, the Megatron flags that change nothing here (and
  // why), what it applied from a DeepSpeed config and what it left.
  std::vector<std::string> source_notes;
  // `--help` / `-h`: nothing else was parsed; the caller prints help_text and exits 0.
  bool help_requested = false;
  std::string help_text;
};

// Parses `keel train` arguments (argv[0] is the subcommand name), reading --config first and
// letting explicit flags override the file. Validates everything (see Validate).
// train-iters/train-samples and lr-warmup-iters/lr-warmup-samples are exclusive pairs: a positive
// value for one zeroes the other (so a flag can switch a file's run between iterations and
// samples); both positive in the same file or command line is an error. A samples-based run drops
// the built-in 30-iteration warmup unless lr-warmup-iters was given explicitly.
Status ParseTrainArgs(int argc, const char* const* argv, ParsedConfig* out);
// ParseTrainArgs without Validate: the settings as given (the --config file under the flags),
// derived values unfilled. For a reader on another host than the ranks' (keel launch), where
// host-bound rules (--threads against this machine's cores) do not apply.
Status ReadTrainArgs(int argc, const char* const* argv, ParsedConfig* out);
// Parses a TOML document (same keys as the flags, without leading dashes) over `cfg`. Unknown keys
// and wrong types are errors; `origin` (a file name) prefixes the messages.
Status ApplyToml(const std::string& toml_text, const std::string& origin, TrainConfig* cfg);
// Megatron-DeepSpeed's --{train,valid}-weighted-split-paths-path file (BLOOM's train-splits.txt):
// one line of groups, each in double quotes, separated by spaces
// ("train: 0.3 0:0.95 data/a, 0.7 0:0.95 data/b"). The groups' own syntax is checked when the
// data is opened (data/weighted_split_paths.h). InvalidArgument naming `origin` and the problem.
Status SplitWeightedSplitPathsFile(const std::string& text, const std::string& origin,
                                   std::vector<std::string>* groups);
// Checks every rule and fills derived values (ffn size, max positions, padded vocab, global batch,
// decay length). Needs vocab_size > 0 for the vocab rules; call again once the data is known.
// Sizes whose products keel computes in 32- or 64-bit integers are bounded so that none overflows
// (docs/config.md lists the limits); each error names the settings, the product and the limit.
Status Validate(TrainConfig* cfg, std::vector<std::string>* notes);
// The resolved config as TOML-like "key = value" lines, printed once at start.
std::string FormatConfig(const TrainConfig& cfg);
// Every setting as (name, TOML literal), in table order (for diffs against a checkpoint's config).
std::vector<std::pair<std::string, std::string>> ConfigValues(const TrainConfig& cfg);
// A stable hash of the resolved config (for run identity and, later, checkpoints).
uint64_t ConfigHash(const TrainConfig& cfg);

}  // namespace keel

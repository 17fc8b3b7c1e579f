// Runs the keel binary under test through the shell (so `VAR=value` prefixes work) and captures
// stdout and stderr together.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "keel_test_paths.h"  // KEEL_BINARY, KEEL_SOURCE_DIR, KEEL_ASSETS_DIR

namespace keel_test {

struct KeelResult {
  int code = -1;
  std::string out;
};

// Runs `cmd` through the shell, stdout and stderr together.
inline KeelResult RunShell(const std::string& cmd) {
  KeelResult r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline KeelResult RunKeelShell(const std::string& env, const std::string& args) {
  return RunShell(env + (env.empty() ? "" : " ") + KEEL_BINARY + " " + args);
}

// An iteration or validation line without its timing fields (elapsed time, samples per second,
// TFLOPs): what must be equal between an interrupted run and one that never stopped.
inline std::string WithoutTimings(const std::string& line) {
  std::string kept;
  size_t f = 0;
  while (f < line.size()) {
    size_t bar = line.find('|', f);
    if (bar == std::string::npos) bar = line.size();
    const std::string field = line.substr(f, bar - f);
    if (field.find("elapsed time") == std::string::npos &&
        field.find("samples per second") == std::string::npos &&
        field.find("TFLOPs") == std::string::npos)
      kept += field + "|";
    f = bar + 1;
  }
  return kept;
}

// A tiny `keel train` for data-parallel tests: 12 sequences per iteration, whole micro-batches of
// 2 on 1, 2 and 3 ranks, one thread per rank.
inline const std::string kDataParallelModel =
    "train --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 "
    "--micro-batch-size 2 --global-batch-size 12 --lr-warmup-iters 2 --log-interval 1 "
    "--eval-interval 1000 --eval-iters 0 --sample-tokens 0 --threads 1 --guard off";

// mpirun as CI runs it: as root, more ranks than cores, no single-copy shared memory (not
// allowed in many containers), and a time limit, so a hang fails the test instead of CI.
inline std::string Mpirun(int np, const std::string& prefix = "", int timeout_s = 120) {
#if defined(KEEL_SANITIZED_BUILD)
  // LeakSanitizer reports Open MPI's own allocations at exit (about 120 kB per rank that the
  // library never frees, measured with a 10-line MPI program): the ranks run without leak
  // checking; addressing and UB checks stay on.
  const std::string asan = "env ASAN_OPTIONS=detect_leaks=0 ";  // env: also as an argv
#else
  const std::string asan;
#endif
  return asan + "timeout " + std::to_string(timeout_s) +
         " mpirun --allow-run-as-root --oversubscribe --mca btl_vader_single_copy_mechanism none "
         "-np " +
         std::to_string(np) + " " + prefix;
}

inline std::string ReadText(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline std::string FreshTempDir(const std::string& name) {
  auto dir =
      std::filesystem::temp_directory_path() / ("keel_" + name + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace keel_test

// End-to-end tests of the keel binary: exit codes and messages for bad input, and a short real
// training run on the default corpus followed by `keel sample` on its saved weights.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "keel_process.h"

namespace {

using Result = keel_test::KeelResult;

Result RunKeel(const std::string& args) {
  return keel_test::RunKeelShell("", args);
}

std::string TempDir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             ("keel_cli_" + name + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

TEST(CliTest, HelpAndUnknownCommand) {
  Result r = RunKeel("--help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("train"), std::string::npos);
  r = RunKeel("trian");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("unknown command 'trian'"), std::string::npos);
  r = RunKeel("train --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("--rampup-batch-size"), std::string::npos);
}

// Every command's usage error exits 2 (keel launch restarts nothing on 2) with the parser's
// message and the command's --help to read; --help exits 0. Before, CLI11's own codes came
// through: 105 (a validation), 106 (a required option or subcommand missing), 109 (an extra
// argument) from data, ckpt, logs, tb, hangs, report, sample and bench.
TEST(CliTest, EveryCommandsUsageErrorExitsTwoAndHelpZero) {
  const std::vector<std::string> commands = {
      "train",      "sample",       "data prepare", "data inspect", "data verify", "bench",
      "ckpt list",  "ckpt inspect", "ckpt verify",  "ckpt diff",    "ckpt edit",   "ckpt pin",
      "ckpt unpin", "ckpt export",  "ckpt import",  "logs analyze", "logs watch",  "report",
      "plan",       "tb rename",    "tb truncate",  "hangs analyze"};
  for (const std::string& c : commands) {
    Result r = RunKeel(c + " --help");
    EXPECT_EQ(r.code, 0) << c << ": " << r.out;
    EXPECT_NE(r.out.find("--help"), std::string::npos) << c << ": " << r.out;
    r = RunKeel(c + " --no-such-flag-xyz 1 < /dev/null");
    EXPECT_EQ(r.code, 2) << c << ": " << r.out;
    EXPECT_NE(r.out.find("error: "), std::string::npos) << c << ": " << r.out;
    EXPECT_NE(r.out.find("--help"), std::string::npos) << c << ": " << r.out;
  }
  // Each group without its subcommand, and the cases the issue found.
  for (const char* c :
       {"data", "ckpt", "logs", "tb", "hangs", "data prepare", "ckpt verify a b", "logs watch",
        "hangs analyze", "hangs analyze a b", "report", "ckpt pin x notanumber",
        "data prepare --input /no/such/file --output-prefix x", "logs analyze x --json=maybe",
        "launch --no-such-flag-xyz -- true"}) {
    Result r = RunKeel(std::string(c) + " < /dev/null");
    EXPECT_EQ(r.code, 2) << c << ": " << r.out;
    EXPECT_NE(r.out.find("--help"), std::string::npos) << c << ": " << r.out;
  }
  Result r = RunKeel("data prepare");
  EXPECT_NE(r.out.find("error: --output-prefix is required; run `keel data prepare --help` for "
                       "its options"),
            std::string::npos)
      << r.out;
  r = RunKeel("ckpt verify a b");
  EXPECT_NE(r.out.find("error: The following argument was not expected: b; run `keel ckpt "
                       "verify --help` for its options"),
            std::string::npos)
      << r.out;
}

TEST(CliTest, InvalidShapeIsRefusedBeforeAnyWorkWithFlagAndFix) {
  Result r = RunKeel("train --hidden-size 250 --num-attention-heads 4");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--hidden-size"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--num-attention-heads"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("iteration"), std::string::npos) << "training started despite the error";
}

TEST(CliTest, ThreadCountFarAboveTheCoresIsRefusedNotACrash) {
  // It used to end in SIGSEGV inside OpenMP once training started.
  Result r = RunKeel("train --threads 100000");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--threads 100000 is more than"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("use --threads 0 for all cores"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("iteration"), std::string::npos) << "training started despite the error";
  r = RunKeel("sample --load /nonexistent --threads 100000");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--threads 100000 is more than"), std::string::npos) << r.out;
}

TEST(CliTest, UnknownFlagSuggestsTheClosestOne) {
  Result r = RunKeel("train --num-layer 2");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--num-layers"), std::string::npos) << r.out;
}

TEST(CliTest, MissingDataPathIsAClearError) {
  Result r = RunKeel("train --data-path /nonexistent/corpus --train-iters 2 --lr-warmup-iters 1");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("/nonexistent/corpus"), std::string::npos) << r.out;
}

TEST(CliTest, TrainsOnDefaultCorpusSavesAndSamples) {
  const std::string dir = TempDir("run");
  Result r = RunKeel(
      "train --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 32 "
      "--micro-batch-size 2 --train-iters 6 --lr-warmup-iters 2 --log-interval 3 "
      "--eval-interval 6 --eval-iters 1 --sample-tokens 8 --save " +
      dir);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("note: --ffn-hidden-size not given"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" iteration        6/       6 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("validation loss at iteration 6"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("sample"), std::string::npos) << r.out;
  EXPECT_TRUE(std::filesystem::exists(dir + "/iter_0000006/model.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/latest_checkpointed_iteration.txt"));
  Result s = RunKeel("sample --load " + dir + " --tokens 5 --prompt Whale");
  EXPECT_EQ(s.code, 0) << s.out;
  EXPECT_NE(s.out.find("sampling from " + dir + "/iter_0000006"), std::string::npos) << s.out;
  EXPECT_TRUE(s.out.rfind("Whale", 0) == 0 || s.out.find("\nWhale") != std::string::npos) << s.out;
  std::filesystem::remove_all(dir);
}

// The Llama example config with the default job's corpus, shrunk to a few iterations: the log
// names the shape and the SwiGLU note, the checkpoint samples (keel sample rebuilds the shape
// from the checkpoint, without the flags).
TEST(CliTest, LlamaExampleTrainsOnTheDefaultCorpusAndSamples) {
  const std::string dir = TempDir("llama");
  Result r = RunKeel("train --config " + std::string(KEEL_SOURCE_DIR) +
                     "/examples/llama-small.toml --num-layers 1 --hidden-size 64 "
                     "--ffn-hidden-size 0 --seq-length 32 --micro-batch-size 2 --train-iters 6 "
                     "--lr-warmup-iters 2 --log-interval 3 --eval-interval 6 --eval-iters 1 "
                     "--sample-tokens 8 --save " +
                     dir);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("note: --ffn-hidden-size not given: using Megatron's SwiGLU size"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("model: 1 layers, hidden 64, ffn 128 SwiGLU, heads 4 (2 key/value), "
                       "positions RoPE (base 10000, 16 of 16 dims), RMSNorm"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("no linear biases"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("validation loss at iteration 6"), std::string::npos) << r.out;
  Result s = RunKeel("sample --load " + dir + " --tokens 5 --prompt Whale");
  EXPECT_EQ(s.code, 0) << s.out;
  EXPECT_TRUE(s.out.rfind("Whale", 0) == 0 || s.out.find("\nWhale") != std::string::npos) << s.out;
  std::filesystem::remove_all(dir);
}

// keel bench --recompute: the granularities (and block recomputation of half the layers) side by
// side, with their activation memory, and the check that they trained the same bits.
TEST(CliTest, BenchRecomputeComparesGranularitiesAndChecksTheBits) {
  Result r = RunKeel("bench --recompute --iters 1 --warmup 0 --seq-length 64 --threads 1");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* row : {"\nnone ", "\nselective ", "\nfull ", "\nblock 2/4 "})
    EXPECT_NE(r.out.find(row), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the same bits in all"), std::string::npos) << r.out;
}

// keel bench --pipeline: the bubble table for each (P, m, V), with the simulated and closed-form
// bubbles and the point-to-point bytes per boundary (b s h floats: 1 x 128 x 256 x 4 bytes).
TEST(CliTest, BenchPipelinePrintsTheBubbleTable) {
  Result r = RunKeel("bench --pipeline --repeats 1 --forward-ms 1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("simulated   formula p2p B/boundary"), std::string::npos) << r.out;
  // P 4, m 8, V 2: simulated and formula both (P-1)/(V m+P-1) = 3/19; bytes exactly b s h x 4.
  EXPECT_NE(r.out.find("    15.8%     15.8%         131072         131072"), std::string::npos)
      << r.out;
}

TEST(CliTest, SampleFromMissingRunNamesTheFile) {
  Result r = RunKeel("sample --load /nonexistent/run");
  EXPECT_EQ(r.code, 2);  // a usage error: the path the user gave holds no checkpoint
  EXPECT_NE(r.out.find("/nonexistent/run holds no checkpoint"), std::string::npos) << r.out;
}

TEST(CliTest, DataPrepareThenTrainOnIt) {
  const std::string dir = TempDir("data");
  for (int d = 0; d < 40; ++d) {
    FILE* f = std::fopen((dir + "/doc" + std::to_string(d) + ".txt").c_str(), "w");
    for (int i = 0; i < 20; ++i)
      std::fprintf(f, "the sea is wide and the whale is white %d. ", i + d);
    std::fclose(f);
  }
  std::string inputs;
  for (int d = 0; d < 40; ++d) inputs += " " + dir + "/doc" + std::to_string(d) + ".txt";
  Result r = RunKeel("data prepare --quiet --tokenizer gpt2 --output-prefix " + dir +
                     "/corpus --input" + inputs);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(std::filesystem::exists(dir + "/corpus.bin"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/corpus.idx"));
  r = RunKeel("train --data-path " + dir +
              "/corpus --num-layers 1 --hidden-size 32 "
              "--num-attention-heads 2 --seq-length 16 --micro-batch-size 2 --train-iters 2 "
              "--lr-warmup-iters 1 --log-interval 1 --eval-iters 1 --sample-tokens 0");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("vocab 50257"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("50304"), std::string::npos) << r.out;  // padded to a multiple of 128
  std::filesystem::remove_all(dir);
}

}  // namespace

namespace {

TEST(CliTest, SaveNeverOverwritesFilesItDidNotWrite) {
  const std::string dir = TempDir("existing");
  FILE* f = std::fopen((dir + "/model.safetensors").c_str(), "w");
  std::fputs("precious", f);
  std::fclose(f);
  Result r = RunKeel(
      "train --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 32 "
      "--micro-batch-size 2 --train-iters 2 --lr-warmup-iters 1 --sample-tokens 0 --save " +
      dir);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(std::filesystem::exists(dir + "/iter_0000002/manifest.json"));
  std::string content(8, '\0');
  f = std::fopen((dir + "/model.safetensors").c_str(), "r");
  ASSERT_EQ(std::fread(content.data(), 1, 8, f), 8u);
  std::fclose(f);
  EXPECT_EQ(content, "precious");
  std::filesystem::remove_all(dir);
}

TEST(CliTest, RunWrittenByAnOlderKeelIsRefusedBeforeTraining) {
  const std::string dir = TempDir("oldrun");
  FILE* f = std::fopen((dir + "/run.json").c_str(), "w");
  std::fputs("{}", f);
  std::fclose(f);
  Result r = RunKeel("train --train-iters 2 --lr-warmup-iters 1 --save " + dir);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("older keel"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(" iteration "), std::string::npos) << "trained despite the refusal";
  std::filesystem::remove_all(dir);
}

}  // namespace

namespace {

// Issue 15's smallest model: every refusal below is about the one flag added to it.
const std::string kT =
    "--num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 32 "
    "--micro-batch-size 2 --global-batch-size 8 --lr-warmup-iters 2 --sample-tokens 0 ";

TEST(CliTest, ModelThatCannotFitIsRefusedBeforeAnyAllocation) {
  // It used to allocate until the process was killed.
  Result r = RunKeel("train " + kT + "--num-layers 1073741824");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("note: memory estimate "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("error: this run needs about "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("TiB of memory but "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("weights "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("reduce --num-layers (at most "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("resolved config"), std::string::npos) << "went on past the check";
  // A model that fits says what it needs and trains.
  r = RunKeel("train " + kT + "--train-iters 4");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("note: memory estimate "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(one micro-batch of 2 x 32 tokens)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("; available "), std::string::npos) << r.out;
}

TEST(CliTest, OutOfMemoryIsAMessageNamingWhatKeelWasDoing) {
#if defined(KEEL_SANITIZED_BUILD)
  GTEST_SKIP() << "AddressSanitizer reserves terabytes of shadow memory and cannot start under "
                  "`ulimit -v`; the Release suite runs this test";
#endif
  // The estimate passes (the machine has the memory) but the process may not map it: std::bad_alloc
  // used to reach the user as "error: std::bad_alloc".
  Result r = keel_test::RunShell("ulimit -v 500000; " + std::string(KEEL_BINARY) + " train " + kT +
                                 "--num-layers 24 --hidden-size 512 --num-attention-heads 8 "
                                 "--train-iters 4 --threads 1");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("error: out of memory while building the model and the optimizer: "
                       "reduce --micro-batch-size"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("std::bad_alloc"), std::string::npos) << r.out;
}

TEST(CliTest, DirectoryAsDataPathSaysWhatADataPrefixIs) {
  // It used to say "cannot mmap 'dirds.idx': No such device" or "'dirds.idx' not found".
  const std::string dir = TempDir("dirds");
  for (const std::string& cmd : {"train " + kT + "--train-iters 4 --data-path " + dir,
                                 "data inspect " + dir, "data verify " + dir}) {
    Result r = RunKeel(cmd);
    EXPECT_EQ(r.code, 2) << cmd << "\n" << r.out;
    EXPECT_NE(r.out.find("'" + dir +
                         "' is a directory, not a dataset prefix: a dataset is two "
                         "files PREFIX.bin and PREFIX.idx, named by their common PREFIX (e.g. "
                         "data/my-corpus"),
              std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("it holds no PREFIX.idx file"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("rebuild it"), std::string::npos) << r.out;
  }
  std::filesystem::create_directories(dir + "/x.idx");
  std::filesystem::create_directories(dir + "/x.bin");
  Result r = RunKeel("data inspect " + dir + "/x");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("dataset file '" + dir + "/x.idx' is a directory"), std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("No such device"), std::string::npos) << r.out;
  std::filesystem::remove_all(dir);
}

}  // namespace

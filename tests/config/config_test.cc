#include "config/config.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "keel_test_paths.h"  // KEEL_BINARY, KEEL_SOURCE_DIR, KEEL_ASSETS_DIR
#include "model/gpt.h"

namespace keel {
namespace {

Status Parse(std::vector<std::string> args, ParsedConfig* out) {
  args.insert(args.begin(), "train");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return ParseTrainArgs(static_cast<int>(argv.size()), argv.data(), out);
}

std::string WriteTemp(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool HasNote(const ParsedConfig& p, const std::string& text) {
  for (const auto& n : p.notes) {
    if (n.find(text) != std::string::npos) return true;
  }
  return false;
}

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "in: " << (haystack)

// ---- defaults, notes, help ----

TEST(ConfigTest, DefaultsValidateAndResolveDerivedValues) {
  ParsedConfig p;
  ASSERT_TRUE(Parse({}, &p).ok());
  EXPECT_FALSE(p.help_requested);
  const TrainConfig& c = p.config;
  EXPECT_EQ(c.model.ffn_hidden, 1024);
  EXPECT_EQ(c.model.max_positions, 128);
  EXPECT_EQ(c.global_batch_size, 16);
  EXPECT_EQ(c.lr_decay_iters, 400);
  EXPECT_EQ(c.train_iters, 400);
  EXPECT_EQ(c.lr_warmup_iters, 40);
  EXPECT_TRUE(HasNote(p, "--ffn-hidden-size not given: using 4 * hidden-size = 1024"));
  EXPECT_TRUE(HasNote(p, "--max-position-embeddings not given"));
  EXPECT_TRUE(HasNote(p, "--lr-decay-iters not given"));
  // as_given keeps the unresolved values for a later Validate with the real data-parallel size.
  EXPECT_EQ(p.as_given.model.ffn_hidden, 0);
  EXPECT_EQ(p.as_given.model.max_positions, 0);
}

TEST(ConfigTest, FfnNoteNamesTheResolvedSize) {
  ParsedConfig p;
  ASSERT_TRUE(Parse({"--hidden-size", "512", "--num-attention-heads", "8"}, &p).ok());
  EXPECT_EQ(p.config.model.ffn_hidden, 2048);
  EXPECT_TRUE(HasNote(p, "--ffn-hidden-size not given: using 4 * hidden-size = 2048"));
  ASSERT_TRUE(Parse({"--ffn-hidden-size", "1000"}, &p).ok());
  EXPECT_EQ(p.config.model.ffn_hidden, 1000);
  EXPECT_FALSE(HasNote(p, "--ffn-hidden-size"));
}

TEST(ConfigTest, ValidateIsIdempotentAndTakesTheDataParallelSizeLater) {
  ParsedConfig p;
  ASSERT_TRUE(Parse({"--micro-batch-size", "4"}, &p).ok());
  TrainConfig c = p.config;
  std::vector<std::string> notes;
  ASSERT_TRUE(Validate(&c, &notes).ok());
  EXPECT_TRUE(notes.empty());
  EXPECT_EQ(FormatConfig(c), FormatConfig(p.config));

  TrainConfig dp4 = p.as_given;
  dp4.data_parallel_size = 4;
  ASSERT_TRUE(Validate(&dp4, &notes).ok());
  EXPECT_EQ(dp4.global_batch_size, 16);
}

TEST(ConfigTest, HelpIsRequestedNotAnError) {
  for (const char* flag : {"--help", "-h"}) {
    ParsedConfig p;
    Status st = Parse({flag}, &p);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_TRUE(p.help_requested);
    EXPECT_CONTAINS(p.help_text, "--num-layers");
    EXPECT_CONTAINS(p.help_text, "--rampup-batch-size");
    EXPECT_CONTAINS(p.help_text, "--config");
    EXPECT_CONTAINS(p.help_text, "default 4");
    EXPECT_CONTAINS(p.help_text, "{constant,linear,cosine}");
  }
}

TEST(ConfigTest, EveryFlagIsAcceptedOnTheCommandLine) {
  ParsedConfig p;
  Status st = Parse({"--num-layers",
                     "2",
                     "--hidden-size",
                     "64",
                     "--ffn-hidden-size",
                     "100",
                     "--num-attention-heads",
                     "2",
                     "--seq-length",
                     "32",
                     "--max-position-embeddings",
                     "64",
                     "--position-embedding-type",
                     "alibi",
                     "--embed-layernorm",
                     "--make-vocab-size-divisible-by",
                     "64",
                     "--layernorm-epsilon",
                     "1e-6",
                     "--init-method",
                     "small_init",
                     "--init-method-std",
                     "0.01",
                     "--micro-batch-size",
                     "2",
                     "--global-batch-size",
                     "16",
                     "--rampup-batch-size",
                     "4",
                     "4",
                     "100",
                     "--train-samples",
                     "10000",
                     "--lr",
                     "3e-4",
                     "--min-lr",
                     "0",
                     "--lr-decay-style",
                     "linear",
                     "--lr-warmup-samples",
                     "100",
                     "--lr-decay-samples",
                     "9000",
                     "--adam-beta1",
                     "0.8",
                     "--adam-beta2",
                     "0.99",
                     "--adam-eps",
                     "1e-6",
                     "--weight-decay",
                     "0",
                     "--clip-grad",
                     "0",
                     "--seed",
                     "7",
                     "--eval-interval",
                     "5",
                     "--eval-iters",
                     "0",
                     "--log-interval",
                     "1",
                     "--threads",
                     "3",
                     "--data-path",
                     "/d/x",
                     "--split",
                     "1,0,0",
                     "--tokenizer",
                     "gpt2",
                     "--save",
                     "/tmp/run",
                     "--sample-tokens",
                     "0",
                     "--sample-prompt",
                     "Hi \"there\""},
                    &p);
  ASSERT_TRUE(st.ok()) << st.ToString();
  const TrainConfig& c = p.config;
  EXPECT_EQ(c.model.num_layers, 2);
  EXPECT_EQ(c.model.ffn_hidden, 100);
  EXPECT_EQ(c.model.Position(), PositionEmbedding::kAlibi);
  EXPECT_TRUE(c.model.embed_layernorm);
  EXPECT_EQ(c.make_vocab_size_divisible_by, 64);
  EXPECT_FLOAT_EQ(c.model.layernorm_eps, 1e-6f);
  EXPECT_EQ(c.init_method, InitMethod::kSmallInit);
  EXPECT_EQ(c.rampup_batch_size, (std::vector<int64_t>{4, 4, 100}));
  EXPECT_EQ(c.train_iters, 0);
  EXPECT_EQ(c.train_samples, 10000);
  EXPECT_EQ(c.lr_warmup_iters, 0);
  EXPECT_EQ(c.lr_decay_style, LrDecayStyle::kLinear);
  EXPECT_DOUBLE_EQ(c.lr, 3e-4);
  EXPECT_EQ(c.seed, 7u);
  EXPECT_EQ(c.threads, 3);
  EXPECT_EQ(c.tokenizer, TokenizerKind::kGpt2);
  EXPECT_EQ(c.save, "/tmp/run");
  EXPECT_EQ(c.sample_prompt, "Hi \"there\"");
  // The resolved config round-trips through its own TOML form.
  TrainConfig back;
  ASSERT_TRUE(ApplyToml(FormatConfig(c), "formatted", &back).ok());
  back.model.padded_vocab = c.model.padded_vocab;
  EXPECT_EQ(FormatConfig(back), FormatConfig(c));
}

// ---- command-line errors ----

TEST(ConfigTest, UnknownFlagSuggestsTheClosestName) {
  ParsedConfig p;
  Status st = Parse({"--num-layer", "4"}, &p);
  ASSERT_FALSE(st.ok());
  EXPECT_CONTAINS(st.message(), "--num-layer");
  EXPECT_CONTAINS(st.message(), "did you mean --num-layers?");
  st = Parse({"--hiden-size=64"}, &p);
  ASSERT_FALSE(st.ok());
  EXPECT_CONTAINS(st.message(), "did you mean --hidden-size?");
  st = Parse({"stray"}, &p);
  ASSERT_FALSE(st.ok());
  EXPECT_CONTAINS(st.message(), "stray");
}

// A flag that takes one value, given more: refused, naming the flag and every value (before,
// CLI11 took them all and kept the last: `--num-layers 1 3` trained 3 layers, `--lr 1e-3 2e-3`
// used 2e-3); a stray word is blamed on the flag it follows, a switch's too.
TEST(ConfigTest, AFlagGivenMoreValuesThanItTakesIsRefused) {
  ParsedConfig p;
  Status st = Parse({"--num-layers", "1", "3"}, &p);
  ASSERT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "unexpected argument '3' after --num-layers 1: --num-layers takes one value and was "
            "given 2: 1 3; remove the extra word, or give it the flag it belongs to (see keel "
            "train --help)");
  st = Parse({"--hidden-size", "64", "--lr", "1e-3", "2e-3", "--seed", "3"}, &p);
  ASSERT_FALSE(st.ok());
  EXPECT_CONTAINS(st.message(),
                  "unexpected argument '2e-3' after --lr 1e-3: --lr takes one value and was "
                  "given 2: 1e-3 2e-3;");
  st = Parse({"--lr=1e-3", "x", "y", "--seed", "3"}, &p);
  ASSERT_FALSE(st.ok());
  EXPECT_CONTAINS(st.message(),
                  "unexpected argument 'x' after --lr 1e-3: --lr takes one value and was given "
                  "3: 1e-3 x y;");
  // A Megatron flag that is not a keel setting, and a negative number (a value, not a flag).
  st = Parse({"--tensorboard-queue-size", "1", "5"}, &p);
  ASSERT_FALSE(st.ok());
  EXPECT_CONTAINS(st.message(),
                  "after --tensorboard-queue-size 1: --tensorboard-queue-size takes "
                  "one value and was given 2: 1 5");
  st = Parse({"--seed", "3", "-1"}, &p);
  ASSERT_FALSE(st.ok());
  EXPECT_CONTAINS(st.message(), "unexpected argument '-1' after --seed 3");
  st = Parse({"--fp16", "x"}, &p);
  ASSERT_FALSE(st.ok());
  EXPECT_CONTAINS(st.message(),
                  "unexpected argument 'x' after --fp16: --fp16 is a switch and takes no value "
                  "(--fp16=false turns it off)");
  st = Parse({"x", "--lr", "1e-3"}, &p);
  ASSERT_FALSE(st.ok());
  EXPECT_CONTAINS(st.message(),
                  "unexpected argument 'x': keel train takes only --flag value pairs");
  // Flags that take several values keep them; a flag given twice still takes the last (scripts
  // override a default that way, as with Megatron's argparse).
  st = Parse({"--data-path", "0.5", "a", "0.5", "b", "--split", "98,2,0", "--lr", "1e-3", "--lr",
              "2e-3", "--train-weighted-split-paths", "X: 1 0:1 a", "Y: 1 0:1 b"},
             &p);
  ASSERT_EQ(st.code(), Status::Code::kInvalidArgument) << st.ToString();  // the groups' names
  EXPECT_EQ(st.message().find("unexpected argument"), std::string::npos) << st.message();
  ASSERT_TRUE(Parse({"--rampup-batch-size", "16", "16", "5859375", "--global-batch-size", "2048",
                     "--micro-batch-size", "16", "--train-samples", "300000000", "--lr", "1e-3",
                     "--lr", "2e-3"},
                    &p)
                  .ok());
  EXPECT_EQ(p.config.lr, 2e-3);
  EXPECT_EQ(p.config.rampup_batch_size, (std::vector<int64_t>{16, 16, 5859375}));
}

// A watchdog limit under a second is refused (before, --distributed-timeout-minutes 1e-9, 60 ns,
// was accepted), naming the flag, the value and the range; 0 still turns the watchdog off.
TEST(ConfigTest, WatchdogLimitsUnderASecondAreRefused) {
  ParsedConfig p;
  for (const char* flag : {"--distributed-timeout-minutes", "--first-iteration-timeout-minutes",
                           "--save-timeout-minutes", "--eval-timeout-minutes"}) {
    for (const char* v : {"1e-9", "0.01"}) {
      Status st = Parse({flag, v}, &p);
      ASSERT_EQ(st.code(), Status::Code::kInvalidArgument) << flag << " " << v;
      EXPECT_CONTAINS(st.message(), std::string(flag) + " " + (v[1] == 'e' ? "1e-09" : v) +
                                        " is under a second: give ");
      EXPECT_CONTAINS(st.message(), "0.01667 (one second) to 10080 (a week)");
    }
    ASSERT_TRUE(Parse({flag, "0.02"}, &p).ok()) << flag;
    EXPECT_EQ(Parse({flag, "-1"}, &p).code(), Status::Code::kInvalidArgument) << flag;
  }
  Status st = Parse({"--distributed-timeout-minutes", "1e-9"}, &p);
  EXPECT_CONTAINS(st.message(), "give 0 (the watchdog off) or 0.01667");
  ASSERT_TRUE(Parse({"--distributed-timeout-minutes", "0"}, &p).ok());
}

TEST(ConfigTest, LocalCheckpointFlagsThatCannotWorkAreRefusedNamingTheFix) {
  const std::vector<std::string> ok = {"--save",
                                       "/tmp/x",
                                       "--non-persistent-save-interval",
                                       "5",
                                       "--non-persistent-local-ckpt-dir",
                                       "/dev/shm/keel"};
  ParsedConfig p;
  ASSERT_TRUE(Parse(ok, &p).ok());
  EXPECT_EQ(p.config.non_persistent_save_interval, 5);
  EXPECT_EQ(p.config.non_persistent_ckpt_type, "local");
  ASSERT_TRUE(Parse({"--non-persistent-ckpt-type", "local"}, &p).ok());  // no interval: off
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"--save", "/tmp/x", "--non-persistent-save-interval", "5"},
       "needs --non-persistent-local-ckpt-dir DIR"},
      {{"--non-persistent-save-interval", "5", "--non-persistent-local-ckpt-dir", "/dev/shm/k"},
       "needs --save DIR"},
      {{"--non-persistent-local-ckpt-dir", "/dev/shm/k"},
       "without --non-persistent-save-interval N: add it"},
      {{"--non-persistent-save-interval", "-1"}, "use 0 for no local checkpoints"},
      {{"--non-persistent-ckpt-type", "global"}, "keel has only the type local"},
      {{"--non-persistent-ckpt-type", "in_memory"}, "keel has only the type local"},
      {{"--non-persistent-ckpt-type", "disk"}, "'disk' is not a type; use local"},
      {{"--save", "/tmp/x", "--save-interval", "50", "--non-persistent-save-interval", "50",
        "--non-persistent-local-ckpt-dir", "/dev/shm/k"},
       "is not shorter than --save-interval 50"},
  };
  for (const auto& [args, fix] : bad) {
    Status st = Parse(args, &p);
    ASSERT_EQ(st.code(), Status::Code::kInvalidArgument) << args[0] << " " << st.ToString();
    EXPECT_CONTAINS(st.message(), fix);
  }
}

// The local tier saves data-parallel layouts only: T > 1, P > 1 and both are refused, naming the
// sizes given and the fix (dropping both local flags: the directory alone is refused too).
TEST(ConfigTest, LocalCheckpointsAtTensorOrPipelineParallelSizesAboveOneAreRefused) {
  const std::vector<std::string> local = {"--save",
                                          "/tmp/x",
                                          "--non-persistent-save-interval",
                                          "5",
                                          "--non-persistent-local-ckpt-dir",
                                          "/dev/shm/keel",
                                          "--num-layers",
                                          "4"};
  const std::vector<std::pair<std::vector<std::string>, std::string>> layouts = {
      {{"--tensor-model-parallel-size", "2"}, "with --tensor-model-parallel-size 2: "},
      {{"--pipeline-model-parallel-size", "2"}, "with --pipeline-model-parallel-size 2: "},
      {{"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"},
       "with --tensor-model-parallel-size 2 and --pipeline-model-parallel-size 2: "},
  };
  ParsedConfig p;
  for (const auto& [layout, named] : layouts) {
    std::vector<std::string> args = local;
    args.insert(args.end(), layout.begin(), layout.end());
    ASSERT_TRUE(Parse(layout, &p).ok()) << layout[0];  // the layout alone is fine
    const Status st = Parse(args, &p);
    ASSERT_EQ(st.code(), Status::Code::kInvalidArgument) << layout[0] << " " << st.ToString();
    EXPECT_CONTAINS(st.message(), "--non-persistent-save-interval 5 " + named);
    EXPECT_CONTAINS(st.message(), "keel's local tier saves data-parallel runs only so far");
    EXPECT_CONTAINS(st.message(),
                    "drop --non-persistent-save-interval and --non-persistent-local-ckpt-dir");
  }
  // The fix works: the same layout without the local flags is accepted.
  ASSERT_TRUE(Parse({"--save", "/tmp/x", "--num-layers", "4", "--tensor-model-parallel-size", "2",
                     "--pipeline-model-parallel-size", "2"},
                    &p)
                  .ok());
}

TEST(ConfigTest, TypeErrorsNameTheFlagValueAndType) {
  ParsedConfig p;
  Status st = Parse({"--num-layers", "four"}, &p);
  ASSERT_FALSE(st.ok());
  EXPECT_CONTAINS(st.message(), "--num-layers four");
  EXPECT_CONTAINS(st.message(), "integer");
  st = Parse({"--lr", "fast"}, &p);
  ASSERT_FALSE(st.ok());
  EXPECT_CONTAINS(st.message(), "--lr fast");
  EXPECT_CONTAINS(st.message(), "number");
  st = Parse({"--lr-decay-style", "exponential"}, &p);
  ASSERT_FALSE(st.ok());
  EXPECT_CONTAINS(st.message(), "--lr-decay-style exponential");
  EXPECT_CONTAINS(st.message(), "constant,linear,cosine");
  st = Parse({"--hidden-size", "99999999999"}, &p);
  ASSERT_FALSE(st.ok());
  EXPECT_CONTAINS(st.message(), "--hidden-size 99999999999");
  st = Parse({"--seed", "-1"}, &p);
  ASSERT_FALSE(st.ok());
  EXPECT_CONTAINS(st.message(), "--seed");
}

TEST(ConfigTest, RampupTakesThreeValues) {
  ParsedConfig p;
  Status st = Parse({"--rampup-batch-size", "16", "16", "5859375", "--global-batch-size", "2048",
                     "--micro-batch-size", "16", "--train-samples", "300000000"},
                    &p);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(p.config.rampup_batch_size, (std::vector<int64_t>{16, 16, 5859375}));
  for (auto vals :
       {std::vector<std::string>{"16", "16"}, std::vector<std::string>{"16", "16", "100", "5"}}) {
    std::vector<std::string> args = {"--rampup-batch-size"};
    args.insert(args.end(), vals.begin(), vals.end());
    args.insert(args.end(), {"--global-batch-size", "2048", "--train-samples", "300000000"});
    st = Parse(args, &p);
    ASSERT_FALSE(st.ok());
    EXPECT_CONTAINS(st.message(), "--rampup-batch-size takes 3 values");
    EXPECT_CONTAINS(st.message(), "e.g. --rampup-batch-size 16 16 5859375");
  }
}

TEST(ConfigTest, TrainSamplesSwitchesARunToSamples) {
  ParsedConfig p;
  ASSERT_TRUE(Parse({"--train-samples", "4000"}, &p).ok());
  EXPECT_EQ(p.config.train_iters, 0);
  EXPECT_EQ(p.config.lr_warmup_iters, 0);  // the built-in iteration warmup does not apply
  EXPECT_EQ(p.config.lr_decay_samples, 4000);

  ASSERT_TRUE(Parse({"--train-samples", "4000", "--lr-warmup-samples", "400"}, &p).ok());
  EXPECT_EQ(p.config.lr_warmup_samples, 400);
  EXPECT_EQ(p.config.lr_warmup_iters, 0);

  Status st = Parse({"--train-iters", "10", "--train-samples", "4000"}, &p);
  ASSERT_FALSE(st.ok());
  EXPECT_CONTAINS(st.message(), "--train-iters 10 and --train-samples 4000");
  EXPECT_CONTAINS(st.message(), "set only one");
  st = Parse({"--lr-warmup-iters", "10", "--lr-warmup-samples", "40"}, &p);
  ASSERT_FALSE(st.ok());
  EXPECT_CONTAINS(st.message(), "--lr-warmup-iters 10 and --lr-warmup-samples 40");
  // An explicit zero is not a conflict (examples/default.toml lists both keys).
  ASSERT_TRUE(Parse({"--train-iters", "100", "--train-samples", "0"}, &p).ok());
}

// ---- TOML ----

TEST(ConfigTest, TomlLoadsAndFlagsOverrideTheFile) {
  std::string path = WriteTemp("override.toml",
                               "num-layers = 6\nhidden-size = 512\nnum-attention-heads = 8\n"
                               "lr = 2e-4\nlr-decay-style = \"linear\"\n");
  ParsedConfig p;
  Status st = Parse({"--config", path, "--num-layers", "2", "--lr", "5e-4"}, &p);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(p.config.model.num_layers, 2);  // flag beats file
  EXPECT_DOUBLE_EQ(p.config.lr, 5e-4);      // flag beats file
  EXPECT_EQ(p.config.model.hidden, 512);    // file beats default
  EXPECT_EQ(p.config.model.heads, 8);
  EXPECT_EQ(p.config.lr_decay_style, LrDecayStyle::kLinear);
  EXPECT_EQ(p.config.seq_length, 128);  // default
  // The flag order does not matter: --config is always read first.
  ASSERT_TRUE(Parse({"--num-layers", "2", "--config", path}, &p).ok());
  EXPECT_EQ(p.config.model.num_layers, 2);
}

TEST(ConfigTest, FlagSwitchesAFileRunFromIterationsToSamples) {
  std::string path = WriteTemp("iters.toml", "train-iters = 100\nlr-warmup-iters = 10\n");
  ParsedConfig p;
  Status st =
      Parse({"--config", path, "--train-samples", "8000", "--lr-warmup-samples", "800"}, &p);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(p.config.train_iters, 0);
  EXPECT_EQ(p.config.lr_warmup_iters, 0);
  // Without the samples warmup, the file's explicit iteration warmup is reported with the fix.
  st = Parse({"--config", path, "--train-samples", "8000"}, &p);
  ASSERT_FALSE(st.ok());
  EXPECT_CONTAINS(st.message(), "--lr-warmup-iters 10");
  EXPECT_CONTAINS(st.message(), "use --lr-warmup-samples 160");
}

TEST(ConfigTest, TomlBothRunLengthsIsAnError) {
  TrainConfig c;
  Status st = ApplyToml("train-iters = 100\ntrain-samples = 1000\n", "run.toml", &c);
  ASSERT_FALSE(st.ok());
  EXPECT_CONTAINS(st.message(), "run.toml");
  EXPECT_CONTAINS(st.message(), "train-iters 100 and train-samples 1000");
}

// Found by fuzz/train_args_fuzz: an argument of only dashes has no flag name to suggest from.
TEST(ConfigTest, ArgumentOfOnlyDashesIsAnError) {
  ParsedConfig p;
  for (const char* arg : {"-", "---"}) {
    Status st = Parse({arg}, &p);
    ASSERT_FALSE(st.ok()) << arg;
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
    EXPECT_CONTAINS(st.message(), std::string("unexpected argument '") + arg + "'");
  }
}

// Found by fuzz/toml_config_fuzz: toml++ 3.3 reaches __builtin_unreachable() on some non-ASCII
// characters outside strings (U+0397 here) and right after a multi-line string's line-ending
// backslash (U+00A7, marzer/tomlplusplus#190). keel refuses those before toml++ reads them.
TEST(ConfigTest, TomlNonAsciiOutsideStringsIsAnError) {
  for (const std::string& text :
       {std::string("\xce\x97"), std::string("num-layers = 2\n  \xcc\xaa = 1\n"),
        std::string("num-layers = 2\xc3\xa9\n"),
        std::string("sample-prompt = \"\"\"\\\n\xc2\xa7\"\"\"\n"),
        std::string("sample-prompt = \"\"\"a\\  \n\n   \xc3\xa9\"\"\"\n"),
        std::string("sample-prompt = \"\"\"a\\\xc3\xa9\"\"\"\n"),
        std::string("sample-prompt = \"\"\"a\"\"\"\"\xc3\xa9\n"),
        // A quote inside a bare value is read ahead as part of it (fuzz: e=0"\xcc\x80).
        std::string("e=0\"\xcc\x80"), std::string("num-layers = 1[\"\xc3\xa9\"]\n"),
        std::string("lr = [1, 2=\"\xc3\xa9\"]\n"), std::string("save = 1979-05-27 0\"\xc3\xa9\"\n"),
        std::string("data-path = [\"a\"\xc3\xa9]\n"), std::string("a\xc3\xa9 = 1\n"),
        std::string("\"a\" \xc3\xa9 = 1\n")}) {
    TrainConfig c;
    Status st = ApplyToml(text, "run.toml", &c);
    ASSERT_FALSE(st.ok()) << text;
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
    EXPECT_CONTAINS(st.message(), "run.toml:");
    EXPECT_CONTAINS(st.message(), "non-ASCII");
  }
  // Where TOML allows it (strings, comments, a byte-order mark) it is read as before.
  TrainConfig c;
  Status st = ApplyToml(
      "\xef\xbb\xbf# \xc3\x9c"
      "bung \xe2\x80\x94 caf\xc3\xa9\n"
      "sample-prompt = \"Caf\xc3\xa9 \xce\x97\\\"\"  # na\xc3\xafve\n"
      "data-path=['d/\xc3\xa9t\xc3\xa9',\"\"\"x\\\n  y\xc3\xa9\"\"\"]\n"
      "split = \'\'\'1,1,\\1\'\'\'\n",
      "run.toml", &c);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(c.sample_prompt, "Caf\xc3\xa9 \xce\x97\"");
  EXPECT_EQ(c.data_path, (std::vector<std::string>{"d/\xc3\xa9t\xc3\xa9", "xy\xc3\xa9"}));
  EXPECT_EQ(c.split, "1,1,\\1");
}

TEST(ConfigTest, TomlUnknownKeySuggestsTheClosestName) {
  TrainConfig c;
  Status st = ApplyToml("hiden-size = 8\n", "run.toml", &c);
  ASSERT_FALSE(st.ok());
  EXPECT_CONTAINS(st.message(), "run.toml:1");
  EXPECT_CONTAINS(st.message(), "unknown key 'hiden-size'");
  EXPECT_CONTAINS(st.message(), "did you mean hidden-size?");
  st = ApplyToml("num_layers = 8\n", "run.toml", &c);
  ASSERT_FALSE(st.ok());
  EXPECT_CONTAINS(st.message(), "did you mean num-layers?");
  st = ApplyToml("config = \"other.toml\"\n", "run.toml", &c);
  ASSERT_FALSE(st.ok());
  EXPECT_CONTAINS(st.message(), "--config");
}

TEST(ConfigTest, TomlTypeErrorsNameKeyValueAndType) {
  TrainConfig c;
  Status st = ApplyToml("\nnum-layers = \"four\"\n", "run.toml", &c);
  ASSERT_FALSE(st.ok());
  EXPECT_CONTAINS(st.message(), "run.toml:2: num-layers = \"four\"");
  EXPECT_CONTAINS(st.message(), "expected an integer, got a string");
  st = ApplyToml("num-layers = 4.5\n", "run.toml", &c);
  ASSERT_FALSE(st.ok());
  EXPECT_CONTAINS(st.message(), "got a float");
  st = ApplyToml("embed-layernorm = 1\n", "run.toml", &c);
  ASSERT_FALSE(st.ok());
  EXPECT_CONTAINS(st.message(), "embed-layernorm = 1");
  EXPECT_CONTAINS(st.message(), "true or false");
  st = ApplyToml("rampup-batch-size = [1, \"x\", 3]\n", "run.toml", &c);
  ASSERT_FALSE(st.ok());
  EXPECT_CONTAINS(st.message(), "rampup-batch-size");
  EXPECT_CONTAINS(st.message(), "list of integers");
  st = ApplyToml("tokenizer = \"bpe\"\n", "run.toml", &c);
  ASSERT_FALSE(st.ok());
  EXPECT_CONTAINS(st.message(), "one of gpt2,sentencepiece");
  st = ApplyToml("num-layers = \n", "run.toml", &c);
  ASSERT_FALSE(st.ok());
  EXPECT_CONTAINS(st.message(), "invalid TOML");
  // Integers are fine where floats are expected.
  ASSERT_TRUE(ApplyToml("lr = 1\n", "run.toml", &c).ok());
  EXPECT_DOUBLE_EQ(c.lr, 1.0);
}

TEST(ConfigTest, MissingConfigFileIsAnError) {
  ParsedConfig p;
  Status st = Parse({"--config", "/nonexistent/run.toml"}, &p);
  ASSERT_FALSE(st.ok());
  EXPECT_CONTAINS(st.message(), "--config /nonexistent/run.toml");
}

TEST(ConfigTest, DefaultTomlIsExactlyTheBuiltInDefaults) {
  const std::string text = ReadFile(std::string(KEEL_SOURCE_DIR) + "/examples/default.toml");
  ASSERT_FALSE(text.empty());
  TrainConfig c;
  Status st = ApplyToml(text, "default.toml", &c);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(FormatConfig(c), FormatConfig(TrainConfig{}));
  // And it spells out every key, so it stays a complete reference.
  std::istringstream lines(FormatConfig(TrainConfig{}));
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::string key = line.substr(0, line.find(' '));
    EXPECT_NE(text.find("\n" + key + " = "), std::string::npos) << key << " missing";
  }
}

TEST(ConfigTest, ExampleConfigsValidate) {
  ParsedConfig p;
  std::string dir = std::string(KEEL_SOURCE_DIR) + "/examples/";
  Status st = Parse({"--config", dir + "gpt2-124m.toml"}, &p);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(p.config.model.num_layers, 12);
  EXPECT_EQ(p.config.model.hidden, 768);
  EXPECT_EQ(p.config.tokenizer, TokenizerKind::kGpt2);
  EXPECT_EQ(p.config.lr_warmup_iters, 700);

  st = Parse({"--config", dir + "bloom-tiny-alibi.toml"}, &p);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(p.config.model.Position(), PositionEmbedding::kAlibi);
  EXPECT_TRUE(p.config.model.embed_layernorm);
  EXPECT_EQ(p.config.init_method, InitMethod::kMegatron530B);
  EXPECT_EQ(p.config.train_iters, 0);
  EXPECT_EQ(p.config.lr_warmup_iters, 0);
  TrainConfig dp2 = p.as_given;
  dp2.data_parallel_size = 2;
  std::vector<std::string> notes;
  st = Validate(&dp2, &notes);
  EXPECT_TRUE(st.ok()) << st.ToString();
}

// ---- validation rules ----

struct Rule {
  std::vector<std::string> args;
  std::vector<std::string> expect;  // substrings of the error: the flag, the value, the fix
};

TEST(ConfigTest, EveryValidationRuleNamesTheFlagAndAFix) {
  const std::vector<Rule> rules = {
      {{"--hidden-size", "1000", "--num-attention-heads", "16"},
       {"--hidden-size 1000 is not divisible by --num-attention-heads 16: hidden size must be a "
        "multiple of the head count; try --hidden-size 1024 or --num-attention-heads 8"}},
      {{"--num-layers", "0"}, {"--num-layers 0", "positive", "set --num-layers"}},
      {{"--hidden-size", "-4"}, {"--hidden-size -4", "positive"}},
      {{"--num-attention-heads", "0"}, {"--num-attention-heads 0", "positive"}},
      {{"--seq-length", "0"}, {"--seq-length 0", "positive"}},
      {{"--micro-batch-size", "0"}, {"--micro-batch-size 0", "positive"}},
      {{"--ffn-hidden-size", "-1"}, {"--ffn-hidden-size -1", "0 for 4 * hidden-size"}},
      {{"--max-position-embeddings", "64"},
       {"--max-position-embeddings 64 is smaller than --seq-length 128",
        "try --max-position-embeddings 128"}},
      {{"--global-batch-size", "20"},
       {"--global-batch-size 20 is not divisible by --micro-batch-size 8",
        "try --global-batch-size 16 or 24"}},
      {{"--global-batch-size", "4"}, {"--global-batch-size 4", "try --global-batch-size 8"}},
      {{"--rampup-batch-size", "8", "8", "100", "--global-batch-size", "32"},
       {"expected no batch-size rampup for iteration-based training", "--train-samples"}},
      {{"--rampup-batch-size", "0", "8", "100", "--global-batch-size", "32", "--train-samples",
        "1000"},
       {"--rampup-batch-size 0 8 100", "must all be positive", "e.g. --rampup-batch-size 8 8"}},
      {{"--rampup-batch-size", "8", "0", "100", "--global-batch-size", "32", "--train-samples",
        "1000"},
       {"--rampup-batch-size 8 0 100", "must all be positive"}},
      {{"--rampup-batch-size", "8", "8", "0", "--global-batch-size", "32", "--train-samples",
        "1000"},
       {"--rampup-batch-size 8 8 0", "must all be positive"}},
      {{"--rampup-batch-size", "64", "8", "100", "--global-batch-size", "32", "--train-samples",
        "1000"},
       {"start batch 64 is larger than --global-batch-size 32", "at most 32"}},
      {{"--rampup-batch-size", "8", "16", "100", "--global-batch-size", "32", "--train-samples",
        "1000"},
       {"--rampup-batch-size 8 16 100", "not a multiple of the increment 16", "try increment 8"}},
      {{"--rampup-batch-size", "8", "4", "100", "--global-batch-size", "32", "--train-samples",
        "1000"},
       {"ramp-up batch size 12 is not divisible by --micro-batch-size 8", "multiples of 8"}},
      {{"--rampup-batch-size", "4", "4", "100", "--global-batch-size", "32", "--train-samples",
        "1000"},
       {"ramp-up batch size 4 is not divisible"}},
      {{"--rampup-batch-size", "8", "8", "5000", "--global-batch-size", "32", "--train-samples",
        "1000"},
       {"ramp-up samples 5000 exceed --train-samples 1000", "at most 1000"}},
      {{"--train-iters", "0"}, {"neither --train-iters nor --train-samples", "e.g. --train-iters"}},
      {{"--train-iters", "-5"}, {"--train-iters -5", "negative"}},
      {{"--lr-warmup-samples", "800", "--lr-warmup-iters", "0"},
       {"--lr-warmup-samples 800 is for samples-based runs", "use --lr-warmup-iters 50"}},
      {{"--lr-decay-samples", "800"},
       {"--lr-decay-samples 800 is for samples-based runs", "use --lr-decay-iters 50"}},
      {{"--train-samples", "8000", "--lr-warmup-iters", "5"},
       {"--lr-warmup-iters 5 is for iteration-based runs", "use --lr-warmup-samples 80"}},
      {{"--train-samples", "8000", "--lr-decay-iters", "500"},
       {"--lr-decay-iters 500 is for iteration-based runs", "use --lr-decay-samples 8000"}},
      {{"--lr-warmup-iters", "400"},
       {"--lr-warmup-iters 400 is not smaller than --lr-decay-iters 400",
        "try --lr-warmup-iters 40"}},
      {{"--lr-warmup-iters", "50", "--lr-decay-iters", "40"},
       {"--lr-warmup-iters 50 is not smaller than --lr-decay-iters 40"}},
      {{"--train-samples", "8000", "--lr-warmup-samples", "8000"},
       {"--lr-warmup-samples 8000 is not smaller than --lr-decay-samples 8000",
        "try --lr-warmup-samples 800"}},
      {{"--lr-warmup-iters", "-1"}, {"--lr-warmup-iters -1", "negative"}},
      {{"--lr", "0"}, {"--lr 0 must be positive", "try --lr"}},
      {{"--lr", "1e308"}, {"--lr 1e+308 is above 10", "try --lr 1e-3"}},
      {{"--lr", "10.5"}, {"--lr 10.5 is above 10"}},
      {{"--lr-scale-on-resume", "1e308"},
       {"--lr-scale-on-resume 1e+308 times --lr 0.002 is above 10", "at most 5000"}},
      {{"--min-lr", "0.01"}, {"--min-lr 0.01 must be between 0 and --lr 0.002", "try --min-lr"}},
      {{"--min-lr", "-1e-5"}, {"--min-lr -1e-05", "try --min-lr"}},
      {{"--adam-beta1", "1"}, {"--adam-beta1 1 must be in [0, 1)", "try --adam-beta1 0.9"}},
      {{"--adam-beta2", "-0.1"}, {"--adam-beta2 -0.1 must be in [0, 1)", "--adam-beta2 0.95"}},
      {{"--adam-eps", "0"}, {"--adam-eps 0 must be positive", "try --adam-eps"}},
      {{"--weight-decay", "-0.1"}, {"--weight-decay -0.1", "use 0"}},
      {{"--clip-grad", "-1"}, {"--clip-grad -1", "use 0"}},
      {{"--eval-interval", "0"}, {"--eval-interval 0 must be positive", "set --eval-interval"}},
      {{"--log-interval", "0"}, {"--log-interval 0 must be positive"}},
      {{"--eval-iters", "-1"}, {"--eval-iters -1", "use 0"}},
      {{"--threads", "-2"}, {"--threads -2"}},
      {{"--sample-tokens", "-2"}, {"--sample-tokens -2"}},
      {{"--split", "90,10"}, {"--split '90,10'", "try --split 969,30,1"}},
      {{"--split", "0,0,0"}, {"--split '0,0,0'", "not all zero"}},
      {{"--split", "90,-10,0"}, {"--split '90,-10,0'"}},
      {{"--split", "a,b,c"}, {"--split 'a,b,c'"}},
      {{"--layernorm-epsilon", "0"}, {"--layernorm-epsilon 0 must be positive", "try"}},
      {{"--init-method-std", "0"}, {"--init-method-std 0 must be positive", "try"}},
      {{"--make-vocab-size-divisible-by", "0"},
       {"--make-vocab-size-divisible-by 0", "try --make-vocab-size-divisible-by 128"}},
  };
  for (const Rule& r : rules) {
    ParsedConfig p;
    Status st = Parse(r.args, &p);
    std::string args;
    for (const auto& a : r.args) args += a + " ";
    ASSERT_FALSE(st.ok()) << "accepted: " << args;
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << args;
    for (const auto& e : r.expect) EXPECT_CONTAINS(st.message(), e) << " for: " << args;
  }
}

// ---- impossible settings: refused up front, never a crash or a hang at run time ----

TEST(ConfigTest, LearningRatesUpToTheBoundAreAccepted) {
  ParsedConfig p;
  ASSERT_TRUE(Parse({"--lr", "10", "--min-lr", "10"}, &p).ok());
  ASSERT_TRUE(Parse({"--lr", "1e-3", "--lr-scale-on-resume", "1e4"}, &p).ok());  // LR 10
}

TEST(ConfigTest, ThreadsAreBoundedByTheMachine) {
  const int max = MaxThreads();
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  EXPECT_EQ(max, static_cast<int>(std::min(1024u, 4 * hw)));
  ParsedConfig p;
  ASSERT_TRUE(Parse({"--threads", std::to_string(max)}, &p).ok());
  EXPECT_EQ(p.config.threads, max);
  ASSERT_TRUE(Parse({"--threads", "0"}, &p).ok());
  // 100000 crashed with SIGSEGV inside OpenMP, 5000 hung; both are above 1024 on every machine.
  for (const std::string& n :
       {std::string("100000"), std::string("5000"), std::to_string(max + 1)}) {
    Status st = Parse({"--threads", n}, &p);
    ASSERT_FALSE(st.ok()) << n;
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
    EXPECT_CONTAINS(st.message(), "--threads " + n + " is more than " + std::to_string(max));
    EXPECT_CONTAINS(st.message(), "4 threads per hardware thread");
    EXPECT_CONTAINS(st.message(),
                    "use --threads 0 for all cores, or at most " + std::to_string(max));
  }
  // The same rule for a file, and for the other commands' --threads.
  Status st = Parse({"--config", WriteTemp("threads.toml", "threads = 100000\n")}, &p);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_CONTAINS(st.message(), "--threads 100000 is more than");
  EXPECT_FALSE(ValidateThreads(100000).ok());
  EXPECT_FALSE(ValidateThreads(-1).ok());
  EXPECT_TRUE(ValidateThreads(max).ok());
  ASSERT_TRUE(Parse({"--help"}, &p).ok());
  EXPECT_CONTAINS(p.help_text, "at most 4 per hardware thread and never above 1024");
}

TEST(ConfigTest, SequenceLongerThanMaxPositionsIsRefusedForEveryPositionType) {
  // alibi with 8 positions used to end in "internal error: gpt.cc: sequence longer than max
  // positions" at the first step.
  for (const char* type : {"learned_absolute", "alibi"}) {
    ParsedConfig p;
    Status st = Parse({"--position-embedding-type", type, "--max-position-embeddings", "8"}, &p);
    ASSERT_FALSE(st.ok()) << type;
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
    EXPECT_CONTAINS(st.message(), "--max-position-embeddings 8 is smaller than --seq-length 128");
    EXPECT_CONTAINS(st.message(), "try --max-position-embeddings 128");
    EXPECT_CONTAINS(st.message(), "--seq-length 8");
    ASSERT_TRUE(Parse({"--position-embedding-type", type, "--max-position-embeddings", "8",
                       "--seq-length", "8"},
                      &p)
                    .ok());
    ASSERT_TRUE(
        Parse({"--position-embedding-type", type, "--max-position-embeddings", "256"}, &p).ok());
  }
  ParsedConfig p;
  Status st = Parse({"--position-embedding-type", "alibi", "--max-position-embeddings", "8"}, &p);
  EXPECT_CONTAINS(st.message(), "with alibi positions too");
}

TEST(ConfigTest, SampleTokensShareKeelSamplesCap) {
  ParsedConfig p;
  ASSERT_TRUE(Parse({"--sample-tokens", std::to_string(kMaxSampleTokens)}, &p).ok());
  for (const std::string& n : {std::to_string(kMaxSampleTokens + 1), std::string("2000000000")}) {
    Status st = Parse({"--sample-tokens", n}, &p);
    ASSERT_FALSE(st.ok()) << n;
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
    EXPECT_CONTAINS(st.message(), "--sample-tokens " + n + " is more than 100000");
    EXPECT_CONTAINS(st.message(), "keel sample --tokens has the same cap");
    EXPECT_CONTAINS(st.message(), "use --sample-tokens 100000 or fewer");
  }
}

TEST(ConfigTest, SizesWhoseProductsOverflowAreRefusedWithTheLimit) {
  const std::vector<Rule> rules = {
      {{"--micro-batch-size", "2000000000", "--global-batch-size", "2000000000"},
       {"--micro-batch-size 2000000000 x (--seq-length 128 + 1) = 258000000000 tokens per "
        "micro-batch is more than 2147483647",
        "use a smaller --micro-batch-size or --seq-length"}},
      {{"--seq-length", "2147483647", "--micro-batch-size", "1", "--global-batch-size", "1"},
       {"(--seq-length 2147483647 + 1) = 2147483648 tokens per micro-batch"}},
      {{"--micro-batch-size", "16", "--hidden-size", "134217728", "--num-attention-heads",
        "134217728"},
       {"--micro-batch-size 16 x --num-attention-heads 134217728 = 2147483648 is more than "
        "2147483647"}},
      {{"--num-layers", "2147483647"}, {"--num-layers 2147483647 is more than 2147483646"}},
      {{"--hidden-size", "1073741824", "--num-attention-heads", "1"},
       {"--hidden-size 1073741824 is more than 536870911", "4 x hidden-size"}},
      {{"--num-layers", "1073741824", "--hidden-size", "65536", "--num-attention-heads", "64"},
       {"--num-layers 1073741824, --hidden-size 65536, --ffn-hidden-size 262144: about",
        "parameters is more than 2^59 (576460752303423488)", "use a smaller model"}},
      {{"--num-layers", "1024", "--hidden-size", "256", "--num-attention-heads", "256",
        "--seq-length", "2000000", "--micro-batch-size", "1", "--global-batch-size", "1"},
       {"one micro-batch's activations would be 1",
        "--num-layers 1024 x --micro-batch-size 1 x --num-attention-heads 256 x --seq-length "
        "2000000 squared = 1048576000000000000",
        "more than 2^59"}},
      {{"--train-iters", "100000000000000000", "--lr-warmup-iters", "0"},
       {"--train-iters 100000000000000000 x --global-batch-size 16 x --seq-length 128 = about "
        "2.05e+20 tokens is more than 2^62 (4611686018427387904)",
        "use a smaller --train-iters"}},
      {{"--lr-decay-iters", "9000000000000000000"}, {"--lr-decay-iters 9000000000000000000 x"}},
      {{"--eval-iters", "9000000000000000000"}, {"--eval-iters 9000000000000000000 x"}},
      {{"--train-samples", "100000000000000000"},
       {"--train-samples 100000000000000000 x --seq-length 128 = about 1.28e+19 tokens",
        "more than 2^62"}},
      {{"--train-samples", "1000", "--lr-warmup-samples", "9000000000000000000"},
       {"--lr-warmup-samples 9000000000000000000 x --seq-length 128"}},
  };
  for (const Rule& r : rules) {
    ParsedConfig p;
    Status st = Parse(r.args, &p);
    std::string args;
    for (const auto& a : r.args) args += a + " ";
    ASSERT_FALSE(st.ok()) << "accepted: " << args;
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << args;
    for (const auto& e : r.expect) EXPECT_CONTAINS(st.message(), e) << " for: " << args;
  }

  // The padded vocabulary is a 32-bit count too (known once the data is).
  TrainConfig c;
  c.model.vocab = 1073741825;
  c.make_vocab_size_divisible_by = 1073741824;
  std::vector<std::string> notes;
  Status st = Validate(&c, &notes);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_CONTAINS(st.message(),
                  "--make-vocab-size-divisible-by 1073741824 pads the vocabulary of 1073741825 "
                  "tokens to 2147483648, more than 2147483647");
}

TEST(ConfigTest, LargeRealModelsAreWithinTheLimits) {
  // GPT-3 175B's shape and run (Brown et al. 2020), BLOOM-176B's vocabulary and ALiBi: far beyond
  // this CPU, but nothing in them overflows.
  TrainConfig c;
  c.model.num_layers = 96;
  c.model.hidden = 12288;
  c.model.heads = 96;
  c.seq_length = 2048;
  c.micro_batch_size = 1;
  c.global_batch_size = 1536;
  c.train_iters = 0;
  c.lr_warmup_iters = 0;
  c.train_samples = 146484375;  // 300B tokens
  c.lr_warmup_samples = 183105;
  c.eval_iters = 100;
  c.model.vocab = 250680;
  c.model.SetPosition(PositionEmbedding::kAlibi);
  std::vector<std::string> notes;
  Status st = Validate(&c, &notes);
  EXPECT_TRUE(st.ok()) << st.ToString();
  c.rampup_batch_size = {16, 16, 5859375};
  st = Validate(&c, &notes);
  EXPECT_TRUE(st.ok()) << st.ToString();
}

TEST(ConfigTest, ValidateRejectsBothRunLengths) {
  TrainConfig c;
  c.train_samples = 1000;  // train_iters keeps its default 400
  std::vector<std::string> notes;
  Status st = Validate(&c, &notes);
  ASSERT_FALSE(st.ok());
  EXPECT_CONTAINS(st.message(), "--train-iters 400 and --train-samples 1000");
}

TEST(ConfigTest, RampupStagesMustSplitOverDataParallelRanks) {
  // tr1-13B: the batch grew by 16, so only DP sizes dividing 16 / micro-batch worked.
  TrainConfig c;
  c.train_iters = 0;
  c.lr_warmup_iters = 0;
  c.train_samples = 1000000;
  c.micro_batch_size = 1;
  c.global_batch_size = 2048;
  c.rampup_batch_size = {16, 16, 100000};
  std::vector<std::string> notes;
  for (int dp : {1, 2, 4, 8, 16}) {
    TrainConfig d = c;
    d.data_parallel_size = dp;
    EXPECT_TRUE(Validate(&d, &notes).ok()) << dp;
  }
  TrainConfig d = c;
  d.data_parallel_size = 32;
  Status st = Validate(&d, &notes);
  ASSERT_FALSE(st.ok());
  EXPECT_CONTAINS(st.message(), "ramp-up batch size 16 is not divisible");
  EXPECT_CONTAINS(st.message(), "data-parallel size 32");
}

TEST(ConfigTest, ConstantDecayAllowsWarmupPastDecay) {
  ParsedConfig p;
  Status st = Parse({"--lr-decay-style", "constant", "--lr-warmup-iters", "300"}, &p);
  EXPECT_TRUE(st.ok()) << st.ToString();
}

TEST(ConfigTest, VocabIsPaddedWithANote) {
  TrainConfig c;
  c.model.vocab = 50257;
  std::vector<std::string> notes;
  ASSERT_TRUE(Validate(&c, &notes).ok());
  EXPECT_EQ(c.model.padded_vocab, 50304);
  bool found = false;
  for (const auto& n : notes) found |= n == "vocab 50257 padded to 50304 (multiple of 128)";
  EXPECT_TRUE(found);
  c.model.vocab = 256;
  ASSERT_TRUE(Validate(&c, &notes).ok());
  EXPECT_EQ(c.model.padded_vocab, 256);
  c.model.vocab = -1;
  EXPECT_FALSE(Validate(&c, &notes).ok());
}

TEST(ConfigTest, ResolvedInitStd) {
  TrainConfig c;
  c.model.hidden = 1024;
  c.init_method_std = 0.006f;
  EXPECT_FLOAT_EQ(c.ResolvedInitStd(), 0.006f);
  c.init_method = InitMethod::kSmallInit;
  EXPECT_FLOAT_EQ(c.ResolvedInitStd(), static_cast<float>(std::sqrt(2.0 / (5.0 * 1024))));
  c.init_method = InitMethod::kMegatron530B;
  EXPECT_FLOAT_EQ(c.ResolvedInitStd(), static_cast<float>(std::sqrt(1.0 / (3.0 * 1024))));
}

TEST(ConfigTest, FormatAndHash) {
  TrainConfig a;
  const std::string text = FormatConfig(a);
  EXPECT_CONTAINS(text, "num-layers = 4\n");
  EXPECT_CONTAINS(text, "lr = 0.002\n");
  EXPECT_CONTAINS(text, "clip-grad = 1.0\n");
  EXPECT_CONTAINS(text, "rampup-batch-size = []\n");
  EXPECT_CONTAINS(text, "position-embedding-type = \"learned_absolute\"\n");
  EXPECT_CONTAINS(text, "sample-prompt = \"Call me\"\n");
  EXPECT_EQ(ConfigHash(a), ConfigHash(TrainConfig{}));
  TrainConfig b;
  b.seq_length = 256;
  EXPECT_NE(ConfigHash(a), ConfigHash(b));
  TrainConfig c;
  c.lr = 1.0000001e-3;
  EXPECT_NE(ConfigHash(a), ConfigHash(c));
}

TEST(ConfigTest, StabilityOptionsParseAndValidate) {
  const char* ok[] = {"train", "--qk-layernorm", "--z-loss", "1e-4"};
  ParsedConfig p;
  ASSERT_TRUE(ParseTrainArgs(4, ok, &p).ok());
  EXPECT_TRUE(p.config.model.qk_layernorm);
  EXPECT_DOUBLE_EQ(p.config.model.z_loss, 1e-4);
  const char* neg[] = {"train", "--z-loss", "-0.1"};
  Status st = ParseTrainArgs(3, neg, &p);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("--z-loss -0.1 must be between 0 (off) and 1"), std::string::npos)
      << st.message();
  TrainConfig c;
  ASSERT_TRUE(ApplyToml("qk-layernorm = true\nz-loss = 0.001\n", "t.toml", &c).ok());
  EXPECT_TRUE(c.model.qk_layernorm);
  EXPECT_DOUBLE_EQ(c.model.z_loss, 0.001);
}

// ---- the Llama family (docs/llama.md) ----

TEST(ConfigLlamaTest, MegatronFlagsSetTheShape) {
  ParsedConfig p;
  ASSERT_TRUE(Parse({"--position-embedding-type", "rope", "--rotary-base", "500000",
                     "--rotary-percent", "0.5", "--normalization", "RMSNorm", "--swiglu",
                     "--group-query-attention", "--num-query-groups", "2",
                     "--untie-embeddings-and-output-weights", "--disable-bias-linear"},
                    &p)
                  .ok());
  const TrainConfig& c = p.config;
  EXPECT_EQ(c.model.Position(), PositionEmbedding::kRope);
  EXPECT_EQ(c.model.rotary_base, 500000);
  EXPECT_DOUBLE_EQ(c.model.rotary_percent, 0.5);
  EXPECT_TRUE(c.model.rmsnorm);
  EXPECT_TRUE(c.model.swiglu);
  EXPECT_EQ(c.model.KvHeads(), 2);
  EXPECT_TRUE(c.model.untie_embeddings);
  EXPECT_TRUE(!c.model.bias);
  // The file spelling of every one of them round-trips through FormatConfig.
  TrainConfig back;
  ASSERT_TRUE(ApplyToml(FormatConfig(c), "formatted.toml", &back).ok());
  EXPECT_EQ(FormatConfig(back), FormatConfig(c));
  EXPECT_EQ(back.model.KvHeads(), 2);
  EXPECT_TRUE(back.model.rmsnorm);
}

// Llama 3.x's RoPE scaling by Megatron-LM's flags (its defaults for the band edges), and linear
// interpolation; both reach the model's frequencies, and the scaling flags without RoPE are noted.
TEST(ConfigLlamaTest, RopeScalingFlagsReachTheModel) {
  ParsedConfig p;
  ASSERT_TRUE(Parse({"--position-embedding-type", "rope", "--use-rope-scaling",
                     "--rope-scaling-factor", "32", "--rotary-base", "500000"},
                    &p)
                  .ok());
  GptSpec s = p.config.model;
  EXPECT_TRUE(s.rope_llama3);
  EXPECT_EQ(s.rope_llama3_factor, 32);
  EXPECT_EQ(s.rope_low_freq_factor, 1);
  EXPECT_EQ(s.rope_high_freq_factor, 4);
  EXPECT_EQ(s.rope_original_max_positions, 8192);
  EXPECT_EQ(s.RopeLinearFactor(), 1);
  TrainConfig back;
  ASSERT_TRUE(ApplyToml(FormatConfig(p.config), "formatted.toml", &back).ok());
  EXPECT_EQ(FormatConfig(back), FormatConfig(p.config));

  ASSERT_TRUE(
      Parse({"--position-embedding-type", "rope", "--rotary-seq-len-interpolation-factor", "4"}, &p)
          .ok());
  s = p.config.model;
  EXPECT_FALSE(s.rope_llama3);
  EXPECT_EQ(s.RopeLinearFactor(), 4);

  ASSERT_TRUE(Parse({"--use-rope-scaling"}, &p).ok());
  EXPECT_TRUE(HasNote(p, "--use-rope-scaling"));
  EXPECT_FALSE(p.config.model.RopeLlama3());  // kept as given, not applied
}

// Megatron-LM's SwiGLU rule int(4h * 2/3 / 64) * 64, said in a note; a given size is kept.
TEST(ConfigLlamaTest, SwigluFfnSizeFollowsMegatronsRule) {
  ParsedConfig p;
  ASSERT_TRUE(Parse({"--swiglu"}, &p).ok());
  EXPECT_EQ(p.config.model.ffn_hidden, 640);  // 4 * 256 * 2/3 = 682.7 -> 640
  EXPECT_TRUE(HasNote(p, "Megatron's SwiGLU size int(4 * hidden-size * 2/3 / 64) * 64 = 640"));
  ASSERT_TRUE(Parse({"--swiglu", "--hidden-size", "4096", "--num-attention-heads", "32"}, &p).ok());
  EXPECT_EQ(p.config.model.ffn_hidden, 10880);
  ASSERT_TRUE(Parse({"--swiglu", "--hidden-size", "4096", "--num-attention-heads", "32",
                     "--ffn-hidden-size", "11008"},
                    &p)
                  .ok());
  EXPECT_EQ(p.config.model.ffn_hidden, 11008);
  EXPECT_FALSE(HasNote(p, "SwiGLU size"));
}

TEST(ConfigLlamaTest, InconsistentShapesAreRefusedWithTheFix) {
  const std::vector<Rule> rules = {
      {{"--group-query-attention", "--num-query-groups", "3"},
       {"--num-query-groups 3 must divide --num-attention-heads 4", "try --num-query-groups 2"}},
      {{"--group-query-attention", "--num-query-groups", "8"},
       {"--num-query-groups 8 must divide --num-attention-heads 4", "try --num-query-groups 4"}},
      {{"--group-query-attention", "--num-query-groups", "0"},
       {"--num-query-groups 0", "try --num-query-groups 1"}},
      {{"--position-embedding-type", "rope", "--rotary-percent", "0"},
       {"--rotary-percent 0 must be in (0, 1]", "try --rotary-percent 1.0"}},
      {{"--position-embedding-type", "rope", "--rotary-percent", "1.5"},
       {"--rotary-percent 1.5 must be in (0, 1]"}},
      // 64 / 4 heads = 16 dims per head; 0.1 of them is 1: RoPE turns pairs.
      {{"--position-embedding-type", "rope", "--hidden-size", "64", "--rotary-percent", "0.1"},
       {"gives 1 rotary dimensions", "an even number >= 2"}},
      {{"--position-embedding-type", "rope", "--rotary-base", "0"},
       {"--rotary-base 0 must be at least 1"}},
      {{"--position-embedding-type", "rope", "--use-rope-scaling", "--rope-scaling-factor", "0.5"},
       {"--rope-scaling-factor 0.5 must be at least 1", "Llama 3.1 uses 8"}},
      {{"--position-embedding-type", "rope", "--use-rope-scaling", "--rope-scaling-low-freq-factor",
        "4", "--rope-scaling-high-freq-factor", "1"},
       {"need 0 < low < high", "Llama 3.x: 1 and 4"}},
      {{"--position-embedding-type", "rope", "--use-rope-scaling",
        "--rope-scaling-original-max-position-embeddings", "0"},
       {"--rope-scaling-original-max-position-embeddings 0 must be positive"}},
      {{"--position-embedding-type", "rope", "--use-rope-scaling",
        "--rotary-seq-len-interpolation-factor", "4"},
       {"both scale RoPE; choose one"}},
      {{"--position-embedding-type", "rope", "--rotary-seq-len-interpolation-factor", "-2"},
       {"--rotary-seq-len-interpolation-factor -2 must be at least 1"}},
      {{"--swiglu", "--hidden-size", "16"},
       {"--swiglu with --hidden-size 16", "gives 0", "give --ffn-hidden-size"}},
      {{"--normalization", "LayerNorm2"}, {"--normalization", "LayerNorm,RMSNorm"}},
      {{"--position-embedding-type", "rotary"}, {"learned_absolute,alibi,rope"}},
  };
  for (const Rule& r : rules) {
    ParsedConfig p;
    const Status st = Parse(r.args, &p);
    ASSERT_FALSE(st.ok()) << r.args[0] << " " << r.args[1];
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
    for (const std::string& e : r.expect) EXPECT_CONTAINS(st.message(), e);
  }
}

// Settings that only matter with another flag are not dropped silently.
TEST(ConfigLlamaTest, SettingsWithoutTheirFeatureAreNotedAsIgnored) {
  ParsedConfig p;
  ASSERT_TRUE(Parse({"--num-query-groups", "2"}, &p).ok());
  EXPECT_EQ(p.config.model.KvHeads(), 4);
  EXPECT_TRUE(HasNote(p, "--num-query-groups 2 without --group-query-attention: ignored"));
  ASSERT_TRUE(Parse({"--rotary-base", "500000"}, &p).ok());
  EXPECT_TRUE(HasNote(p, "given without --position-embedding-type rope: ignored"));
  ASSERT_TRUE(Parse({"--position-embedding-type", "rope", "--rotary-base", "500000"}, &p).ok());
  EXPECT_FALSE(HasNote(p, "ignored"));
}

TEST(ConfigTest, RecomputeGranularityParsesAndIsFreeOnResume) {
  ParsedConfig p;
  ASSERT_TRUE(Parse({"--recompute-granularity", "full"}, &p).ok());
  EXPECT_EQ(p.config.recompute_granularity, Recompute::kFull);
  ASSERT_TRUE(Parse({"--recompute-granularity", "selective"}, &p).ok());
  EXPECT_EQ(p.config.recompute_granularity, Recompute::kSelective);
  const Status st = Parse({"--recompute-granularity", "layers"}, &p);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_CONTAINS(st.message(), "none,selective,full");
  TrainConfig c;
  ASSERT_TRUE(ApplyToml("recompute-granularity = \"full\"\n", "t.toml", &c).ok());
  EXPECT_EQ(c.recompute_granularity, Recompute::kFull);
}

// Megatron-LM's --recompute-method / --recompute-num-layers: block N recomputes the first N
// layers (FullRecomputeLayers gives the model that count); uniform every layer, a chunk size over 1
// noted; both only refine full recomputation.
TEST(ConfigTest, RecomputeMethodAndLayersRefineFullRecomputation) {
  ParsedConfig p;
  ASSERT_TRUE(Parse({"--num-layers", "6", "--recompute-granularity", "full", "--recompute-method",
                     "block", "--recompute-num-layers", "2"},
                    &p)
                  .ok());
  EXPECT_EQ(p.config.recompute_method, RecomputeMethod::kBlock);
  EXPECT_EQ(p.config.full_recompute_layers(), 2);
  const GptSpec spec = p.config.model;
  EXPECT_EQ(GptModel::FullRecomputeLayers(spec, Recompute::kFull, p.config.full_recompute_layers()),
            2);
  ASSERT_TRUE(Parse({"--checkpoint-activations", "--recompute-method", "uniform",
                     "--recompute-num-layers", "3"},
                    &p)
                  .ok());
  EXPECT_EQ(p.config.full_recompute_layers(), -1);
  EXPECT_EQ(GptModel::FullRecomputeLayers(p.config.model, Recompute::kFull, -1), 4);
  EXPECT_TRUE(HasNote(p, "recomputes one layer at a time"));
  // Megatron-DeepSpeed's spelling of the chunk size.
  ASSERT_TRUE(Parse({"--checkpoint-activations", "--checkpoint-num-layers", "1"}, &p).ok());
  EXPECT_EQ(p.config.recompute_num_layers, 1);
  const std::vector<Rule> rules = {
      {{"--recompute-method", "block", "--recompute-num-layers", "2"},
       {"refine --recompute-granularity full, but it is none", "add --recompute-granularity full"}},
      {{"--recompute-granularity", "selective", "--recompute-num-layers", "2"},
       {"but it is selective"}},
      {{"--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers",
        "5"},
       {"--recompute-num-layers 5 with --recompute-method block must be from 0 to --num-layers 4"}},
      {{"--recompute-granularity", "full", "--recompute-num-layers", "0"},
       {"--recompute-num-layers 0 must be at least 1 with --recompute-method uniform"}},
      {{"--recompute-granularity", "full", "--recompute-method", "chunks"}, {"uniform,block"}},
  };
  for (const Rule& r : rules) {
    SCOPED_TRACE(testing::PrintToString(r.args));
    const Status st = Parse(r.args, &p);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
    for (const std::string& want : r.expect) EXPECT_CONTAINS(st.message(), want);
  }
}

// Megatron-DeepSpeed's --checkpoint-activations is full recomputation, Megatron-LM's
// --recompute-activations selective; each noted, and a granularity given beside one must agree.
TEST(ConfigTest, MegatronRecomputationFlagsAreTheGranularity) {
  ParsedConfig p;
  ASSERT_TRUE(Parse({"--checkpoint-activations"}, &p).ok());
  EXPECT_EQ(p.config.recompute_granularity, Recompute::kFull);
  std::string notes;
  for (const std::string& n : p.source_notes) notes += n + "\n";
  EXPECT_CONTAINS(notes, "--checkpoint-activations: keel's --recompute-granularity full");
  ASSERT_TRUE(Parse({"--recompute-activations"}, &p).ok());
  EXPECT_EQ(p.config.recompute_granularity, Recompute::kSelective);
  ASSERT_TRUE(Parse({"--checkpoint-activations", "--recompute-granularity", "full"}, &p).ok());
  EXPECT_EQ(p.config.recompute_granularity, Recompute::kFull);
  Status st = Parse({"--checkpoint-activations", "--recompute-granularity", "selective"}, &p);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_CONTAINS(st.message(), "--recompute-granularity selective is given: drop one");
  st = Parse({"--checkpoint-activations", "--recompute-activations"}, &p);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_CONTAINS(st.message(), "ask for two granularities");
  // DeepSpeed's implementation switch alone recomputes nothing, and says so.
  ASSERT_TRUE(Parse({"--deepspeed-activation-checkpointing"}, &p).ok());
  EXPECT_EQ(p.config.recompute_granularity, Recompute::kNone);
  notes.clear();
  for (const std::string& n : p.source_notes) notes += n + "\n";
  EXPECT_CONTAINS(notes, "which is not given: nothing is recomputed");
}

TEST(ConfigLlamaTest, ExampleLlamaConfigIsTheDefaultJobLlamaShaped) {
  ParsedConfig p;
  const Status st =
      Parse({"--config", std::string(KEEL_SOURCE_DIR) + "/examples/llama-small.toml"}, &p);
  ASSERT_TRUE(st.ok()) << st.ToString();
  const TrainConfig& c = p.config;
  EXPECT_EQ(c.model.Position(), PositionEmbedding::kRope);
  EXPECT_TRUE(c.model.rmsnorm);
  EXPECT_TRUE(c.model.swiglu);
  EXPECT_EQ(c.model.KvHeads(), 2);
  EXPECT_TRUE(!c.model.bias);
  EXPECT_DOUBLE_EQ(c.lr, 1e-3);  // half the default's (docs/llama.md)
  // Everything else is the default job's: corpus, length, batch, width.
  const TrainConfig d;
  EXPECT_EQ(c.data_path, d.data_path);
  EXPECT_EQ(c.train_iters, d.train_iters);
  EXPECT_EQ(c.global_batch_size, d.global_batch_size);
  EXPECT_EQ(c.model.hidden, d.model.hidden);
  EXPECT_EQ(c.model.num_layers, d.model.num_layers);
}

TEST(ConfigTest, GuardSettingsParseAndValidate) {
  const char* ok[] = {"train", "--guard", "observe", "--skip-train-iteration-range",
                      "5-9",   "20-20"};
  ParsedConfig p;
  ASSERT_TRUE(ParseTrainArgs(6, ok, &p).ok());
  EXPECT_EQ(p.config.guard, GuardLevel::kObserve);
  std::vector<std::pair<int64_t, int64_t>> r;
  ASSERT_TRUE(ParseIterationRanges(p.config.skip_train_iteration_range, &r).ok());
  EXPECT_EQ(r, (std::vector<std::pair<int64_t, int64_t>>{{5, 9}, {20, 20}}));
  for (const char* bad : {"0-5", "9-5", "5", "a-b", "5-"}) {
    EXPECT_FALSE(ParseIterationRanges({bad}, &r).ok()) << bad;
  }
  const char* cut[] = {"train", "--guard-lr-cut", "0"};
  EXPECT_FALSE(ParseTrainArgs(3, cut, &p).ok());
  TrainConfig c;
  ASSERT_TRUE(ApplyToml("skip-train-iteration-range = [\"1-2\", \"4-8\"]\n", "t.toml", &c).ok());
  EXPECT_EQ(c.skip_train_iteration_range, (std::vector<std::string>{"1-2", "4-8"}));
}

}  // namespace
}  // namespace keel

namespace keel {
namespace {

// ---- mixed precision ----

TEST(ConfigPrecisionTest, MegatronFlagsPickTheRecipe) {
  ParsedConfig p;
  ASSERT_TRUE(Parse({}, &p).ok());
  EXPECT_EQ(p.config.precision, Precision::kFp32);
  ASSERT_TRUE(Parse({"--bf16"}, &p).ok());
  EXPECT_EQ(p.config.precision, Precision::kBf16);
  ASSERT_TRUE(Parse({"--fp16", "--initial-loss-scale", "65536", "--loss-scale-window", "500",
                     "--hysteresis", "3", "--min-loss-scale", "2"},
                    &p)
                  .ok());
  EXPECT_EQ(p.config.precision, Precision::kFp16);
  EXPECT_EQ(p.config.initial_loss_scale, 65536);
  EXPECT_EQ(p.config.loss_scale_window, 500);
  EXPECT_EQ(p.config.hysteresis, 3);
  EXPECT_EQ(p.config.min_loss_scale, 2);
  EXPECT_FALSE(HasNote(p, "loss-scale settings are ignored"));
  // A programmatic config may name the precision; Validate sets the flags to match.
  TrainConfig c;
  c.precision = Precision::kFp16;
  std::vector<std::string> notes;
  ASSERT_TRUE(Validate(&c, &notes).ok());
  EXPECT_TRUE(c.fp16);
  EXPECT_FALSE(c.bf16);
}

TEST(ConfigPrecisionTest, BothRecipesOrBadScalesAreRefusedWithTheFix) {
  ParsedConfig p;
  Status st = Parse({"--bf16", "--fp16"}, &p);
  ASSERT_FALSE(st.ok());
  EXPECT_CONTAINS(st.message(), "--bf16 and --fp16 are both set");
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"--fp16", "--initial-loss-scale", "0"},
        {"--fp16", "--min-loss-scale", "-1"},
        {"--fp16", "--min-loss-scale", "1024", "--initial-loss-scale", "512"},
        {"--fp16", "--loss-scale-window", "0"},
        {"--fp16", "--hysteresis", "0"},
        {"--fp16", "--loss-scale", "-8"}}) {
    st = Parse(bad, &p);
    EXPECT_FALSE(st.ok()) << bad[1];
    EXPECT_CONTAINS(st.message(), bad[1]);
  }
}

// Megatron scripts pass loss-scale flags with --bf16 too: accepted, and the log says they do
// nothing.
TEST(ConfigPrecisionTest, LossScaleFlagsWithoutFp16AreNotedAsIgnored) {
  ParsedConfig p;
  ASSERT_TRUE(Parse({"--bf16", "--loss-scale-window", "500"}, &p).ok());
  EXPECT_TRUE(HasNote(p, "loss-scale settings are ignored: loss scaling applies only to --fp16"));
}

TEST(ConfigPrecisionTest, TomlRoundTripsThePrecision) {
  ParsedConfig p;
  ASSERT_TRUE(Parse({"--fp16", "--loss-scale", "128"}, &p).ok());
  const std::string toml = FormatConfig(p.config);
  EXPECT_CONTAINS(toml, "fp16 = true");
  const std::string path = WriteTemp("fp16.toml", toml);
  ParsedConfig q;
  ASSERT_TRUE(Parse({"--config", path}, &q).ok());
  EXPECT_EQ(q.config.precision, Precision::kFp16);
  EXPECT_EQ(q.config.loss_scale, 128);
}

}  // namespace
}  // namespace keel

// The flags of Megatron-LM / Megatron-DeepSpeed launch scripts: numbers as Python's argparse
// reads them, Megatron's spellings of keel settings, flags accepted with a note that says why
// they change nothing, flags whose feature keel lacks (exit 2 naming every one), --zero-stage,
// the DeepSpeed config JSON, the tokenizer flags, --pad-vocab-size-to and the weighted split
// path files.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "config/config.h"
#include "config/deepspeed_config.h"

namespace keel {
namespace {

Status Parse(std::vector<std::string> args, ParsedConfig* out) {
  args.insert(args.begin(), "train");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return ParseTrainArgs(static_cast<int>(argv.size()), argv.data(), out);
}

std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/megatron_flags_" + name;
  std::ofstream(path) << text;
  return path;
}

bool HasNote(const std::vector<std::string>& notes, const std::string& text) {
  for (const auto& n : notes)
    if (n.find(text) != std::string::npos) return true;
  return false;
}

std::string All(const std::vector<std::string>& notes) {
  std::string s;
  for (const auto& n : notes) s += n + "\n";
  return s;
}

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "in: " << (haystack)

const std::vector<std::string> kSamplesRun = {"--train-samples", "1000", "--lr-warmup-samples",
                                              "16"};

std::vector<std::string> With(std::vector<std::string> extra) {
  std::vector<std::string> a = kSamplesRun;
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

TEST(MegatronFlagsTest, NumbersReadAsPythonsArgparseReadsThem) {
  ParsedConfig p;
  Status st =
      Parse({"--train-samples", "220_000_000", "--lr-warmup-samples", "183_105",
             "--rampup-batch-size", "192", "16", "9_765_625", "--global-batch-size", "2048",
             "--micro-batch-size", "2", "--lr", "6e-5", "--min-lr", "6e-6", "--seed", "+42"},
            &p);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(p.config.train_samples, 220000000);
  EXPECT_EQ(p.config.lr_warmup_samples, 183105);
  EXPECT_EQ(p.config.rampup_batch_size, (std::vector<int64_t>{192, 16, 9765625}));
  EXPECT_EQ(p.config.seed, 42u);
  // Python refuses these too: an underscore must sit between two digits.
  for (const char* bad : {"1__000", "_1000", "1000_", "1_e3"}) {
    st = Parse({"--train-iters", bad}, &p);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << bad;
  }
}

TEST(MegatronFlagsTest, MegatronSpellingsAreKeelSettingsAndSaySo) {
  ParsedConfig p;
  ASSERT_TRUE(Parse({"--override-lr-scheduler"}, &p).ok());
  EXPECT_TRUE(p.config.override_scheduler);
  EXPECT_TRUE(HasNote(p.source_notes, "--override-lr-scheduler is read as --override-scheduler"))
      << All(p.source_notes);
  ASSERT_TRUE(Parse({"--override-opt_param-scheduler"}, &p).ok());
  EXPECT_TRUE(p.config.override_scheduler);
  // Both spellings at once: one setting given twice.
  Status st = Parse({"--override-lr-scheduler", "--override-scheduler"}, &p);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_CONTAINS(st.message(), "Megatron's spelling of keel's --override-scheduler");
  // Megatron's old --model-parallel-size is --tensor-model-parallel-size (a keel setting).
  st = Parse({"--model-parallel-size", "2"}, &p);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(p.config.tensor_model_parallel_size, 2);
  // A misspelt Megatron flag gets a suggestion like any other.
  st = Parse({"--tensorboard-queue-sise", "5"}, &p);
  EXPECT_CONTAINS(st.message(), "did you mean --tensorboard-queue-size");
}

TEST(MegatronFlagsTest, FlagsThatChangeNothingHereAreAcceptedWithTheReason) {
  ParsedConfig p;
  Status st = Parse(With({"--data-impl",
                          "mmap",
                          "--abort-on-unmet-fused-kernel-constraints",
                          "--tensorboard-queue-size",
                          "5",
                          "--distributed-backend",
                          "nccl",
                          "--valid-num-workers",
                          "0",
                          "--tensor-model-parallel-size",
                          "1",
                          "--pipeline-model-parallel-size",
                          "1",
                          "--pp-partition-method",
                          "'type:transformer|embedding'",
                          "--sync-tp-duplicated-parameters",
                          "--codecarbon-dir",
                          "/tmp/cc",
                          "--optimizer",
                          "adam",
                          "--local_rank=0"}),
                    &p);
  ASSERT_TRUE(st.ok()) << st.ToString();
  for (const char* note :
       {"--data-impl mmap: keel always memory-maps",
        "--abort-on-unmet-fused-kernel-constraints: keel's CPU kernels",
        "--tensorboard-queue-size 5: keel writes and flushes each TensorBoard event",
        "--distributed-backend nccl: this is a CPU build: MPI carries the collectives",
        "--valid-num-workers 0: keel reads validation samples on the loop's own thread",
        "--sync-tp-duplicated-parameters: with one tensor-parallel rank",
        "--codecarbon-dir /tmp/cc: keel does not measure energy", "--local_rank 0: keel takes"})
    EXPECT_TRUE(HasNote(p.source_notes, note)) << note << "\n" << All(p.source_notes);
  // Parallel sizes of 1 and Megatron's adam are what keel does: nothing to say (the parallel
  // sizes and --pp-partition-method are keel settings; the run notes a method with one stage).
  EXPECT_FALSE(HasNote(p.source_notes, "--tensor-model-parallel-size"));
  EXPECT_FALSE(HasNote(p.source_notes, "--pipeline-model-parallel-size"));
  EXPECT_FALSE(HasNote(p.source_notes, "--pp-partition-method"));
  EXPECT_FALSE(HasNote(p.source_notes, "--optimizer"));
  // A value Megatron itself would refuse.
  st = Parse({"--distributed-backend", "carrier-pigeon"}, &p);
  EXPECT_CONTAINS(st.message(), "expected one of nccl, gloo, mpi, ccl");
}

TEST(MegatronFlagsTest, FeaturesKeelLacksExitTwoNamingEveryOneAtOnce) {
  ParsedConfig p;
  Status st = Parse(With({"--tensor-model-parallel-size", "4", "--pipeline-model-parallel-size",
                          "12", "--pp-partition-method", "type:transformer", "--optimizer", "sgd",
                          "--data-impl", "lazy", "--zero-stage", "3"}),
                    &p);
  ASSERT_EQ(st.code(), Status::Code::kInvalidArgument);
  // Tensor and pipeline parallelism are keel's: not named.
  EXPECT_EQ(st.message().find("--tensor-model-parallel-size 4"), std::string::npos) << st.message();
  EXPECT_EQ(st.message().find("--pipeline-model-parallel-size"), std::string::npos) << st.message();
  EXPECT_EQ(st.message().find("--pp-partition-method"), std::string::npos) << st.message();
  for (const char* named :
       {"--optimizer sgd (SGD", "--data-impl lazy (reading the lazy IndexedDataset format",
        "ZeRO stage 3"})
    EXPECT_CONTAINS(st.message(), named);
  EXPECT_CONTAINS(st.message(), "docs/config.md");
  // Not a bare usage error: each one says what keel does instead.
  st = Parse(With({"--zero-stage", "2"}), &p);
  EXPECT_CONTAINS(st.message(), "ZeRO stage 2 (gradients sharded over the ranks)");
  st = Parse({"--zero-stage", "7"}, &p);
  EXPECT_CONTAINS(st.message(), "expected a ZeRO stage, 0 to 3");
}

// Sizes and counts below their range are refused naming the flag, the value and the range.
// Before, `--pipeline-model-parallel-size -1` was taken for the parse error's own -1 and passed.
TEST(MegatronFlagsTest, SizesAndCountsBelowTheirRangeAreRefused) {
  ParsedConfig p;
  for (const char* flag : {"--pipeline-model-parallel-size"}) {
    for (const char* v : {"-1", "0"}) {
      Status st = Parse(With({flag, v}), &p);
      ASSERT_EQ(st.code(), Status::Code::kInvalidArgument) << flag << " " << v;
      EXPECT_CONTAINS(st.message(), std::string(flag) + " " + v + " must be positive");
    }
  }
  ASSERT_TRUE(Parse(With({"--pipeline-model-parallel-size", "1"}), &p).ok());
  for (auto [flag, v, min] : {std::tuple{"--valid-num-workers", "-2", "0"},
                              {"--tensorboard-queue-size", "0", "1"},
                              {"--tensorboard-log-interval", "-5", "1"}}) {
    Status st = Parse(With({flag, v}), &p);
    ASSERT_EQ(st.code(), Status::Code::kInvalidArgument) << flag;
    EXPECT_CONTAINS(st.message(), std::string(flag) + " " + v + ": must be at least " + min);
    st = Parse(With({flag, "two"}), &p);
    EXPECT_CONTAINS(st.message(), std::string(flag) + " two: expected an integer");
    ASSERT_TRUE(Parse(With({flag, "2"}), &p).ok()) << flag;
  }
}

TEST(MegatronFlagsTest, ZeroStageIsTheDistributedOptimizer) {
  ParsedConfig p;
  ASSERT_TRUE(Parse({"--zero-stage", "0"}, &p).ok());
  EXPECT_FALSE(p.config.use_distributed_optimizer);
  EXPECT_TRUE(HasNote(p.source_notes, "ZeRO stage 0 is keel's --use-distributed-optimizer=false"));
  ASSERT_TRUE(Parse({"--zero-stage", "1"}, &p).ok());
  EXPECT_TRUE(p.config.use_distributed_optimizer);
  Status st = Parse({"--zero-stage", "1", "--use-distributed-optimizer=false"}, &p);
  EXPECT_CONTAINS(st.message(), "drop one of them");
  // BLOOM: ZeRO 0 with bf16 under DeepSpeed is the BF16 optimizer, which shards the states.
  const std::string ds = WriteTemp("bf16.json", R"({"zero_optimization": {"stage": 0},
      "bf16": {"enabled": true}})");
  ASSERT_TRUE(
      Parse({"--zero-stage", "0", "--bf16", "--deepspeed", "--deepspeed_config", ds}, &p).ok());
  EXPECT_TRUE(p.config.use_distributed_optimizer);
  EXPECT_TRUE(HasNote(p.source_notes, "BF16_Optimizer shards the optimizer states"))
      << All(p.source_notes);
}

// tr8-104B's DeepSpeed config with its flags: the file's dynamic loss scaling is the run's (as in
// Megatron-DeepSpeed, whose DeepSpeed engine scales the loss), and --loss-scale 12 is named
// unused.
TEST(MegatronFlagsTest, DeepSpeedConfigIsAppliedAndWhatItOverridesIsNamed) {
  const std::string ds = WriteTemp("tr8.json", R"({
    "train_micro_batch_size_per_gpu": 1, "train_batch_size": 32, "gradient_clipping": 1.0,
    "zero_optimization": {"stage": 1},
    "fp16": {"enabled": true, "loss_scale": 0, "loss_scale_window": 500, "hysteresis": 2,
             "min_loss_scale": 1, "initial_scale_power": 12},
    "steps_per_print": 2000, "wall_clock_breakdown": false})");
  ParsedConfig p;
  Status st = Parse(
      With({"--micro-batch-size", "1", "--global-batch-size", "32", "--loss-scale", "12", "--fp16",
            "--clip-grad", "1.0", "--deepspeed", "--deepspeed_config", ds, "--zero-stage", "1"}),
      &p);
  ASSERT_TRUE(st.ok()) << st.ToString();
  const TrainConfig& c = p.config;
  EXPECT_TRUE(c.fp16);
  EXPECT_EQ(c.loss_scale, 0.0);  // dynamic
  EXPECT_EQ(c.initial_loss_scale, 4096.0);
  EXPECT_EQ(c.loss_scale_window, 500);
  EXPECT_EQ(c.hysteresis, 2);
  EXPECT_EQ(c.min_loss_scale, 1.0);
  EXPECT_EQ(c.clip_grad, 1.0);
  EXPECT_TRUE(c.use_distributed_optimizer);
  EXPECT_EQ(c.deepspeed_config, ds);
  EXPECT_TRUE(HasNote(p.source_notes, "--loss-scale 12 unused: under --deepspeed"))
      << All(p.source_notes);
  EXPECT_TRUE(HasNote(p.source_notes, "dynamic loss scaling from 2^12 = 4096"))
      << All(p.source_notes);
  EXPECT_TRUE(HasNote(p.source_notes,
                      "not applied: steps_per_print (keel prints the iteration line every "
                      "--log-interval), wall_clock_breakdown"))
      << All(p.source_notes);
  // The file alone sets the batch sizes, precision and clipping.
  ASSERT_TRUE(Parse(With({"--deepspeed", "--deepspeed_config", ds}), &p).ok());
  EXPECT_EQ(p.config.micro_batch_size, 1);
  EXPECT_EQ(p.config.global_batch_size, 32);
  EXPECT_TRUE(p.config.fp16);
  EXPECT_TRUE(HasNote(p.source_notes, "--micro-batch-size 1 (train_micro_batch_size_per_gpu)"));
}

TEST(MegatronFlagsTest, DeepSpeedConfigConflictsAndUnsupportedKeysAreErrorsWithTheFix) {
  ParsedConfig p;
  const std::string ds = WriteTemp("b.json", R"({"train_batch_size": 64})");
  Status st = Parse({"--global-batch-size", "32", "--deepspeed", "--deepspeed_config", ds}, &p);
  EXPECT_CONTAINS(st.message(), "train_batch_size is 64 but --global-batch-size is 32");
  const std::string fp = WriteTemp("fp.json", R"({"fp16": {"enabled": true}})");
  st = Parse({"--bf16", "--deepspeed", "--deepspeed_config", fp}, &p);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  const std::string opt = WriteTemp("opt.json", R"({"optimizer": {"type": "Adam"}})");
  st = Parse({"--deepspeed", "--deepspeed_config", opt}, &p);
  EXPECT_CONTAINS(st.message(), "optimizer is given: under DeepSpeed it replaces the optimizer");
  st = Parse({"--deepspeed"}, &p);
  EXPECT_CONTAINS(st.message(), "--deepspeed needs --deepspeed_config FILE");
  st = Parse({"--deepspeed", "--deepspeed_config", "/nonexistent/ds.json"}, &p);
  EXPECT_CONTAINS(st.message(), "--deepspeed_config /nonexistent/ds.json: cannot read");
  // Without --deepspeed, Megatron-DeepSpeed does not read the file either.
  ASSERT_TRUE(Parse({"--deepspeed_config", opt}, &p).ok());
  EXPECT_TRUE(HasNote(p.source_notes, "is not read without --deepspeed"));
  // Gradient accumulation: the global batch follows when not given, and must agree when given.
  const std::string gas = WriteTemp(
      "gas.json", R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4})");
  ASSERT_TRUE(
      Parse({"--global-batch-size", "0", "--deepspeed", "--deepspeed_config", gas}, &p).ok());
  EXPECT_EQ(p.config.global_batch_size, 8);
  st = Parse({"--global-batch-size", "6", "--deepspeed", "--deepspeed_config", gas}, &p);
  EXPECT_CONTAINS(st.message(), "gradient_accumulation_steps 4 = 8");
}

TEST(MegatronFlagsTest, DeepSpeedJsonValuesAreCheckedByKeyAndValue) {
  DeepSpeedConfig ds;
  for (const auto& [json, says] : std::vector<std::pair<std::string, std::string>>{
           {"[1]", "is not a JSON object"},
           {"{nope", "is not valid JSON"},
           {R"({"train_batch_size": "auto"})", "train_batch_size is \"auto\""},
           {R"({"train_batch_size": -4})", "train_batch_size must be a positive integer"},
           {R"({"gradient_clipping": "x"})", "gradient_clipping must be a number"},
           {R"({"zero_optimization": {"stage": 4}})", "zero_optimization.stage must be 0, 1, 2"},
           {R"({"fp16": {"initial_scale_power": 99}})", "initial_scale_power must be an integer"},
           {R"({"fp16": {"consecutive_hysteresis": true}})", "consecutive_hysteresis is true"},
           {R"({"amp": {"enabled": true}})", "Apex AMP is not in keel"},
           {R"({"bf16": {"enabled": 1}})", "bf16.enabled must be true or false"}}) {
    Status st = ParseDeepSpeedConfig(json, "ds.json", &ds);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << json;
    EXPECT_CONTAINS(st.message(), says);
  }
  ASSERT_TRUE(ParseDeepSpeedConfig(R"({"bfloat16": {"enabled": true}, "flops_profiler": {},
      "zero_optimization": {"stage": 1, "reduce_bucket_size": 5e8}, "new_key": 1})",
                                   "ds.json", &ds)
                  .ok());
  EXPECT_EQ(ds.bf16, true);
  EXPECT_EQ(ds.zero_stage, 1);
  ASSERT_EQ(ds.ignored.size(), 3u);
  EXPECT_CONTAINS(ds.ignored[1], "new_key (not known to keel)");  // keys in sorted order
}

TEST(MegatronFlagsTest, TokenizerFlags) {
  ParsedConfig p;
  // pretrain_gpt.py's default type, from the files alone (tr8 and tr1 pass no --tokenizer-type).
  ASSERT_TRUE(Parse({"--vocab-file", "v.json", "--merge-file", "m.txt"}, &p).ok());
  EXPECT_EQ(p.config.tokenizer_type, "GPT2BPETokenizer");
  EXPECT_EQ(p.as_given.tokenizer_type, "GPT2BPETokenizer");  // the run opens the data with it
  EXPECT_TRUE(HasNote(p.source_notes, "--tokenizer-type not given: GPT2BPETokenizer"));
  // A config made in code resolves the same way when validated.
  TrainConfig c;
  c.vocab_file = "v.json";
  c.merge_file = "m.txt";
  std::vector<std::string> notes;
  ASSERT_TRUE(Validate(&c, &notes).ok());
  EXPECT_EQ(c.tokenizer_type, "GPT2BPETokenizer");
  EXPECT_TRUE(HasNote(notes, "--tokenizer-type not given: GPT2BPETokenizer"));
  Status st = Parse({"--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", "v.json"}, &p);
  EXPECT_CONTAINS(st.message(), "needs --vocab-file and --merge-file");
  st = Parse({"--tokenizer-type", "PretrainedFromHF"}, &p);
  EXPECT_CONTAINS(st.message(), "needs --tokenizer-name-or-path DIR");
  st = Parse({"--tokenizer-type", "BertWordPieceCase"}, &p);
  EXPECT_CONTAINS(st.message(), "the BERT WordPiece tokenizers are for BERT");
  st = Parse({"--tokenizer-model", "x.model"}, &p);
  EXPECT_CONTAINS(st.message(), "pass --tokenizer-type SentencePieceTokenizer");
  ASSERT_TRUE(Parse({"--tokenizer-type", "PretrainedFromHF", "--tokenizer-name-or-path", "dir",
                     "--vocab-file", "v.json"},
                    &p)
                  .ok());
  EXPECT_TRUE(HasNote(p.notes, "--vocab-file unused: --tokenizer-type PretrainedFromHF"));
}

TEST(MegatronFlagsTest, PadVocabSizeTo) {
  TrainConfig c;
  c.model.vocab = 250680;
  c.pad_vocab_size_to = 250880;  // BLOOM's
  std::vector<std::string> notes;
  ASSERT_TRUE(Validate(&c, &notes).ok());
  EXPECT_EQ(c.model.padded_vocab, 250880);
  EXPECT_TRUE(HasNote(notes, "vocab 250680 padded to 250880 (--pad-vocab-size-to)"));
  c.pad_vocab_size_to = 250000;
  Status st = Validate(&c, &notes);
  EXPECT_CONTAINS(st.message(), "smaller than the tokenizer's vocabulary of 250680");
  c.pad_vocab_size_to = 250900;
  st = Validate(&c, &notes);
  EXPECT_CONTAINS(st.message(), "not a multiple of --make-vocab-size-divisible-by 128");
}

TEST(MegatronFlagsTest, WeightedSplitPathFiles) {
  std::vector<std::string> groups;
  // What bigscience's load_ratios_meg_ds_format.py writes for --split valid.
  ASSERT_TRUE(SplitWeightedSplitPathsFile(
                  "\"valid: 0.3 0.950:1.0 a/x, 0.7 0.950:1.0 b/y\" \"valid_a: 1 0.950:1.0 a/x\"\n",
                  "f", &groups)
                  .ok());
  EXPECT_EQ(groups, (std::vector<std::string>{"valid: 0.3 0.950:1.0 a/x, 0.7 0.950:1.0 b/y",
                                              "valid_a: 1 0.950:1.0 a/x"}));
  for (const char* bad : {"\"a: 1 0:1 x\"\n\"b: 1 0:1 y\"\n", "a: 1 0:1 x\n", "\"\"\n",
                          "\"a: 1 0:1 x\"\"b: 1 0:1 y\"", "\"a: 1 \"x\" 0:1\""})
    EXPECT_EQ(SplitWeightedSplitPathsFile(bad, "f", &groups).code(), Status::Code::kInvalidArgument)
        << bad;
  const std::string train = WriteTemp("train-splits.txt", "\"train: 1 0:0.95 data/a\"\n");
  ParsedConfig p;
  ASSERT_TRUE(Parse({"--train-weighted-split-paths-path", train}, &p).ok());
  EXPECT_EQ(p.config.train_weighted_split_paths,
            (std::vector<std::string>{"train: 1 0:0.95 data/a"}));
  Status st = Parse({"--train-weighted-split-paths-path", train, "--train-weighted-split-paths",
                     "train: 1 0:1 b"},
                    &p);
  EXPECT_CONTAINS(st.message(), "are both given");
  st = Parse({"--train-weighted-split-paths-path", train, "--data-path", "x"}, &p);
  EXPECT_CONTAINS(st.message(), "--data-path and --train-weighted-split-paths are both given");
  st = Parse({"--valid-weighted-split-paths", "v: 1 0:1 x"}, &p);
  EXPECT_CONTAINS(st.message(), "needs --train-weighted-split-paths");
  st = Parse({"--train-weighted-split-paths-path", "/nonexistent/t.txt"}, &p);
  EXPECT_CONTAINS(st.message(), "cannot read the file");
}

TEST(MegatronFlagsTest, MegatronFlagsInATomlFileToo) {
  const std::string toml = WriteTemp("run.toml", R"(data-impl = "mmap"
override-lr-scheduler = true
tensor-model-parallel-size = 1
num-workers = 2
)");
  ParsedConfig p;
  Status st = Parse({"--config", toml}, &p);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(p.config.override_scheduler);
  EXPECT_EQ(p.config.num_workers, 2);
  EXPECT_TRUE(HasNote(p.source_notes, ":1: data-impl: keel always memory-maps"))
      << All(p.source_notes);
  // A checkpoint's config.toml holds settings only: there a Megatron flag is an unknown key.
  TrainConfig c;
  st = ApplyToml("data-impl = \"mmap\"\n", "config.toml", &c);
  EXPECT_CONTAINS(st.message(), "unknown key 'data-impl'");
  st = Parse({"--num-workers", "65"}, &p);
  EXPECT_CONTAINS(st.message(), "--num-workers 65 must be between 0");
}

}  // namespace
}  // namespace keel

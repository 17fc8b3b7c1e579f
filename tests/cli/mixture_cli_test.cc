// `keel train` on a mixture of datasets, end to end: a run stopped and resumed three times reads
// the same (dataset, sample) sequence and ends bit-identical to one that never stopped, with the
// same per-dataset loss lines (mid log-interval too); shares follow the weights; the TOML list
// form equals the flags; a change of weights on resume needs --override-data-order; different
// tokenizers are refused before any work; --skip-train-samples-range skips the iterations that
// read those samples, the same as the equivalent iteration range; and the bundled SOTU corpus
// mixes with Moby-Dick through a shared sentencepiece model.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/rng.h"
#include "data/indexed_dataset.h"
#include "keel_process.h"

namespace keel {
namespace {

using keel_test::FreshTempDir;
using keel_test::RunKeelShell;

void WriteDataset(const std::string& prefix, int docs, int tag, int vocab = 512) {
  IndexedDatasetWriter w(Env::Default(), prefix, vocab);
  ASSERT_TRUE(w.Open().ok());
  for (int d = 0; d < docs; ++d) {
    // Each dataset has its own simple statistics (a learnable pattern per tag).
    const int len =
        20 + static_cast<int>(U64At({7, RngPurpose::kTest, static_cast<uint64_t>(tag)}, d) % 60);
    std::vector<int32_t> doc(len);
    int32_t v = 1 + static_cast<int32_t>(
                        U64At({5, RngPurpose::kTest, static_cast<uint64_t>(tag)}, d) % 200);
    for (int i = 0; i < len; ++i) {
      doc[i] = v;
      v = 1 + (v * (tag + 2) + 7) % 250;
    }
    doc.push_back(0);
    ASSERT_TRUE(w.AddDocument(doc).ok());
  }
  ASSERT_TRUE(w.Finish({"gpt2", "", vocab, 0}).ok());
}

const char* const kModel =
    " --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 32 "
    "--micro-batch-size 4 --global-batch-size 8 --lr-warmup-iters 3 --log-interval 10 "
    "--eval-interval 20 --eval-iters 1 --sample-tokens 0 --threads 1 --train-iters 40";

// Iteration, per-dataset and validation lines without their timing fields, in order.
std::vector<std::string> TrainingLines(const std::string& out) {
  std::vector<std::string> lines;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(" iteration ", 0) != 0 && line.rfind(" lm loss per dataset", 0) != 0 &&
        line.rfind(" validation loss", 0) != 0)
      continue;
    lines.push_back(keel_test::WithoutTimings(line));
  }
  return lines;
}

std::string Fingerprint(const std::string& out) {
  const std::string tag = "state fingerprint: ";
  const size_t p = out.rfind(tag);
  return p == std::string::npos ? "" : out.substr(p + tag.size(), 16);
}

class MixtureCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshTempDir("mixture");
    WriteDataset(dir_ + "/a", 300, 1);
    WriteDataset(dir_ + "/b", 120, 2);
    mix_ = " --data-path 0.75 " + dir_ + "/a 0.25 " + dir_ + "/b";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_, mix_;
};

TEST_F(MixtureCliTest, ThreeRestartsGiveTheUninterruptedRunBitForBit) {
  const auto ref =
      RunKeelShell("", "train" + std::string(kModel) + mix_ + " --save " + dir_ + "/ref");
  ASSERT_EQ(ref.code, 0) << ref.out;
  EXPECT_NE(ref.out.find("data: a = " + dir_ + "/a (weight 0.7500)"), std::string::npos) << ref.out;
  EXPECT_NE(ref.out.find(" lm loss per dataset | a: "), std::string::npos) << ref.out;
  EXPECT_NE(ref.out.find(" validation loss at iteration 20 [b] | lm loss value: "),
            std::string::npos);
  const std::vector<std::string> want = TrainingLines(ref.out);
  ASSERT_EQ(want.size(), 4u * 2 + 2u * 3);  // 4 iteration + 4 per-dataset, 2 x 3 validation

  // Stops at 7, 19 and 33 (mid log-interval), each resumed with the same command.
  std::vector<std::string> got;
  std::string last;
  for (int stop : {7, 19, 33, 0}) {
    const std::string extra = stop ? " --exit-interval " + std::to_string(stop) : "";
    const auto r = RunKeelShell(
        "", "train" + std::string(kModel) + mix_ + " --save " + dir_ + "/resumed" + extra);
    ASSERT_EQ(r.code, 0) << r.out;
    for (const std::string& l : TrainingLines(r.out)) got.push_back(l);
    last = r.out;
  }
  EXPECT_EQ(got, want);
  EXPECT_EQ(Fingerprint(last), Fingerprint(ref.out));
  ASSERT_FALSE(Fingerprint(last).empty());

  // The metrics stream: one record per iteration with each dataset's loss; shares follow the
  // weights (6 and 2 of every 8 sequences).
  std::ifstream m(dir_ + "/ref/metrics.jsonl");
  std::string line;
  int train = 0, valid = 0;
  int64_t seq_a = 0, seq_b = 0;
  while (std::getline(m, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j["kind"] == "train") {
      ++train;
      EXPECT_EQ(j["iteration"], train);
      seq_a += j["datasets"]["a"]["sequences"].get<int64_t>();
      seq_b += j["datasets"]["b"]["sequences"].get<int64_t>();
      EXPECT_TRUE(j["datasets"]["a"]["lm_loss"].is_number());
    } else {
      ++valid;
      EXPECT_TRUE(j["datasets"]["b"]["lm_loss_ppl"].is_number());
    }
  }
  EXPECT_EQ(train, 40);
  EXPECT_EQ(valid, 2);
  EXPECT_EQ(seq_a, 240);
  EXPECT_EQ(seq_b, 80);
}

TEST_F(MixtureCliTest, TomlListEqualsFlagsAndWeightsChangeNeedsOverride) {
  const auto flags = RunKeelShell("", "train" + std::string(kModel) + mix_ + " --train-iters 10");
  ASSERT_EQ(flags.code, 0) << flags.out;
  std::ofstream(dir_ + "/mix.toml")
      << "data-path = [0.75, \"" << dir_ << "/a\", 0.25, \"" << dir_ << "/b\"]\n";
  const auto toml = RunKeelShell(
      "", "train" + std::string(kModel) + " --config " + dir_ + "/mix.toml --train-iters 10");
  ASSERT_EQ(toml.code, 0) << toml.out;
  EXPECT_EQ(Fingerprint(toml.out), Fingerprint(flags.out));

  const std::string save = " --save " + dir_ + "/run --exit-interval 5";
  ASSERT_EQ(RunKeelShell("", "train" + std::string(kModel) + mix_ + save).code, 0);
  const std::string other = " --data-path 0.5 " + dir_ + "/a 0.5 " + dir_ + "/b";
  const auto refused = RunKeelShell("", "train" + std::string(kModel) + other + save);
  EXPECT_EQ(refused.code, 2) << refused.out;
  EXPECT_NE(refused.out.find("data-path"), std::string::npos) << refused.out;
  EXPECT_NE(refused.out.find("--override-data-order"), std::string::npos) << refused.out;
  const auto accepted =
      RunKeelShell("", "train" + std::string(kModel) + other + save + " --override-data-order");
  EXPECT_EQ(accepted.code, 0) << accepted.out;
  EXPECT_NE(accepted.out.find("accepted change on resume: data-path"), std::string::npos)
      << accepted.out;
}

TEST_F(MixtureCliTest, DifferentVocabulariesAreRefusedBeforeAnyWork) {
  WriteDataset(dir_ + "/big", 50, 3, 1024);
  const auto r = RunKeelShell("", "train" + std::string(kModel) + " --data-path 1 " + dir_ +
                                      "/a 1 " + dir_ + "/big --save " + dir_ + "/never");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("vocab 1024"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("same tokenizer"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(" iteration "), std::string::npos);
  const auto bad = RunKeelShell(
      "", "train" + std::string(kModel) + " --data-path 0.5 " + dir_ + "/a " + dir_ + "/b");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("WEIGHT PREFIX pairs"), std::string::npos) << bad.out;
}

TEST_F(MixtureCliTest, SkipTrainSamplesRangeSkipsTheIterationsThatReadThem) {
  // Global batch 8: samples 80..99 are read by iterations 11..13 (samples 80..103).
  const auto by_samples =
      RunKeelShell("", "train" + std::string(kModel) + mix_ +
                           " --train-iters 20 --skip-train-samples-range 80-99");
  ASSERT_EQ(by_samples.code, 0) << by_samples.out;
  EXPECT_NE(by_samples.out.find("data: iterations 11..13 will be skipped"), std::string::npos)
      << by_samples.out;
  EXPECT_NE(by_samples.out.find("skipping iterations 11..13: their 24 samples are read past "
                                "without an update (samples 80..103)"),
            std::string::npos)
      << by_samples.out;
  const auto by_iters =
      RunKeelShell("", "train" + std::string(kModel) + mix_ +
                           " --train-iters 20 --skip-train-iteration-range 11-13");
  ASSERT_EQ(by_iters.code, 0) << by_iters.out;
  EXPECT_EQ(Fingerprint(by_samples.out), Fingerprint(by_iters.out));
  const auto none = RunKeelShell("", "train" + std::string(kModel) + mix_ + " --train-iters 20");
  EXPECT_NE(Fingerprint(none.out), Fingerprint(by_iters.out));
  const auto bad =
      RunKeelShell("", "train" + std::string(kModel) + mix_ + " --skip-train-samples-range 9-3");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("--skip-train-samples-range 9-3"), std::string::npos) << bad.out;
}

TEST_F(MixtureCliTest, DocumentResetsChangeTrainingAndNeedOverrideOnResume) {
  const std::string base = "train" + std::string(kModel) + mix_ + " --train-iters 6";
  const auto plain = RunKeelShell("", base);
  const auto reset =
      RunKeelShell("", base + " --reset-position-ids --reset-attention-mask --save " + dir_ + "/r");
  ASSERT_EQ(plain.code, 0) << plain.out;
  ASSERT_EQ(reset.code, 0) << reset.out;
  EXPECT_NE(Fingerprint(plain.out), Fingerprint(reset.out));  // documents are 20-80 tokens
  const auto again =
      RunKeelShell("", base + " --train-iters 8 --override-scheduler --save " + dir_ + "/r");
  EXPECT_EQ(again.code, 2) << again.out;
  EXPECT_NE(again.out.find("reset-position-ids: true -> false"), std::string::npos) << again.out;
}

TEST_F(MixtureCliTest, AnExhaustedDatasetSaysSoAndAResumeSaysWhichEpoch) {
  WriteDataset(dir_ + "/tiny", 12, 4);  // about 20 train samples of 33 tokens
  const std::string base = "train" + std::string(kModel) + " --data-path 0.5 " + dir_ + "/a 0.5 " +
                           dir_ + "/tiny --save " + dir_ + "/ep";
  const auto first = RunKeelShell("", base + " --exit-interval 12");
  ASSERT_EQ(first.code, 0) << first.out;
  EXPECT_NE(first.out.find("data: tiny exhausted after 1 epoch(s) of "), std::string::npos)
      << first.out;
  EXPECT_NE(first.out.find("epoch 2 begins with a new deterministic order"), std::string::npos);
  const auto resumed = RunKeelShell("", base);
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("data: tiny is in epoch "), std::string::npos) << resumed.out;
}

TEST_F(MixtureCliTest, RestartFromAnOlderCheckpointArchivesTheMetricsAfterIt) {
  const std::string base = "train" + std::string(kModel) + mix_ + " --train-iters 20 " +
                           "--save-interval 10 --keep-last-checkpoints 0 --save " + dir_ + "/run";
  ASSERT_EQ(RunKeelShell("", base).code, 0);
  const auto again = RunKeelShell("", base + " --load " + dir_ + "/run/iter_0000010");
  ASSERT_EQ(again.code, 0) << again.out;
  EXPECT_NE(again.out.find("metrics: the records after iteration 10 were moved to " + dir_ +
                           "/run/metrics-archive/rollback-iter20-to-iter10-"),
            std::string::npos)
      << again.out;
  std::ifstream live(dir_ + "/run/metrics.jsonl");
  int64_t expect = 1;
  for (std::string line; std::getline(live, line);) {
    const auto m = nlohmann::json::parse(line);
    if (m["kind"] == "train") {
      EXPECT_EQ(m["iteration"], expect++);
    }
  }
  EXPECT_EQ(expect, 21);
}

TEST(SotuCorpusTest, PreparedWithMobyDicksModelAndMixed) {
  const std::string dir = FreshTempDir("sotu");
  auto moby = RunKeelShell("",
                           "data prepare --corpus moby-dick --tokenizer sentencepiece --quiet "
                           "--output-prefix " +
                               dir + "/moby");
  ASSERT_EQ(moby.code, 0) << moby.out;
  auto sotu = RunKeelShell("",
                           "data prepare --corpus sotu --tokenizer sentencepiece --quiet "
                           "--tokenizer-model " +
                               dir + "/moby.model --output-prefix " + dir + "/sotu");
  ASSERT_EQ(sotu.code, 0) << sotu.out;
  EXPECT_NE(sotu.out.find("corpus sotu: 233 documents"), std::string::npos) << sotu.out;
  auto inspect = RunKeelShell("", "data inspect " + dir + "/sotu --doc 0 --tokens 12");
  ASSERT_EQ(inspect.code, 0) << inspect.out;
  EXPECT_NE(inspect.out.find("Fellow-Citizens of the Sen"), std::string::npos) << inspect.out;
  // Trained separately, the two sentencepiece models differ: a mixture of them is refused.
  ASSERT_EQ(RunKeelShell("",
                         "data prepare --corpus sotu --tokenizer sentencepiece --quiet "
                         "--output-prefix " +
                             dir + "/sotu_own")
                .code,
            0);
  auto refused = RunKeelShell("", "train" + std::string(kModel) + " --data-path 0.5 " + dir +
                                      "/moby 0.5 " + dir + "/sotu_own");
  EXPECT_EQ(refused.code, 2) << refused.out;
  EXPECT_NE(refused.out.find("different sentencepiece models"), std::string::npos) << refused.out;
  auto mixed =
      RunKeelShell("", "train" + std::string(kModel) + " --train-iters 10 --data-path 0.5 " + dir +
                           "/moby 0.5 " + dir + "/sotu --sample-tokens 8");
  ASSERT_EQ(mixed.code, 0) << mixed.out;
  EXPECT_NE(mixed.out.find(" lm loss per dataset | moby: "), std::string::npos) << mixed.out;
  EXPECT_NE(mixed.out.find("sample (temperature"), std::string::npos) << mixed.out;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace keel

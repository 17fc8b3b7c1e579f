// Hostile inputs end to end, where the exit code and the message are the behaviour: token ids
// outside the vocabulary (an int32 id of 2e9, which once crashed the embedding with SIGSEGV; a
// uint16 65535 under GPT-2's vocabulary padded to 50304, which once trained to exit 0) make
// `keel train` exit 2 naming the document and the position, after saving the last completed
// iteration; --lr 1e308 is refused; a checkpoint holding NaN/Inf weights is never exported,
// sampled or trained on (exit 1, the count and the first tensor named).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>

#include "checkpoint/checkpoint_rewrite.h"
#include "checkpoint/safetensors.h"
#include "data/indexed_dataset.h"
#include "data/train_data.h"
#include "keel_process.h"

namespace keel {
namespace {

namespace fs = std::filesystem;
using keel_test::FreshTempDir;
using keel_test::ReadText;
using keel_test::RunKeelShell;

const char* const kModel =
    "train --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 32 "
    "--micro-batch-size 2 --global-batch-size 8 --lr-warmup-iters 2 --sample-tokens 0 "
    "--threads 1 --seed 1234 --split 969,30,1 ";

// 60 documents of 39 tokens and an EOD: token p of the stream is token p % 40 of document p / 40.
// `writer_vocab` picks the dtype on disk (uint16 up to 65535, else int32); `bad` sets stream
// positions to ids the metadata's vocabulary does not hold.
void WriteDataset(const std::string& prefix, const DatasetMeta& meta, int writer_vocab,
                  const std::map<int64_t, int32_t>& bad = {}) {
  IndexedDatasetWriter w(Env::Default(), prefix, writer_vocab);
  ASSERT_TRUE(w.Open().ok());
  for (int d = 0; d < 60; ++d) {
    std::vector<int32_t> doc(40, meta.eod_id);
    for (int i = 0; i < 39; ++i) doc[i] = (d * 7 + i * 13) % (meta.eod_id > 0 ? meta.eod_id : 500);
    for (const auto& [p, id] : bad)
      if (p / 40 == d) doc[p % 40] = id;
    ASSERT_TRUE(w.AddDocument(doc).ok());
  }
  ASSERT_TRUE(w.Finish(meta).ok());
}

// The training sample (position in the run's sample stream) whose tokens hold stream position p,
// for kModel's seed, split and sequence length.
int64_t SampleReading(const std::string& prefix, int64_t p) {
  std::unique_ptr<TrainData> td;
  EXPECT_TRUE(TrainData::Open(Env::Default(), {{1.0, prefix}}, "969,30,1", 32, 1234, &td).ok());
  std::vector<int32_t> t(33);
  for (int64_t k = 0; k < 1000; ++k) {
    const int64_t first = td->GetTrainSample(k, 0, t.data()).first_token;
    if (first <= p && p <= first + 32) return k;
  }
  return -1;
}

// Stream token `offset` of training sample k.
int64_t TokenOfSample(const std::string& prefix, int64_t k, int offset) {
  std::unique_ptr<TrainData> td;
  EXPECT_TRUE(TrainData::Open(Env::Default(), {{1.0, prefix}}, "969,30,1", 32, 1234, &td).ok());
  std::vector<int32_t> t(33);
  return td->GetTrainSample(k, 0, t.data()).first_token + offset;
}

void ExpectHas(const std::string& out, const std::string& want) {
  EXPECT_NE(out.find(want), std::string::npos) << "missing: " << want << "\n" << out;
}

class HostileInputCliTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = FreshTempDir("hostile"); }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  std::string dir_;
};

TEST_F(HostileInputCliTest, Int32IdOfTwoBillionExitsTwoNamingItsDocumentNotSigsegv) {
  const std::string data = Path("data");
  WriteDataset(data, {"gpt2", "", 512, 0}, std::numeric_limits<int32_t>::max(), {{0, 2000000000}});
  const int64_t k = SampleReading(data, 0);
  ASSERT_GE(k, 0);
  const int64_t iteration = k / 8 + 1;  // global batch 8
  const keel_test::KeelResult r =
      RunKeelShell("", std::string(kModel) + "--train-iters 10 --save-interval 100 --data-path " +
                           data + " --save " + Path("run"));
  ASSERT_EQ(r.code, 2) << r.out;
  ExpectHas(r.out, "token 0 of document 0 is id 2000000000, outside the vocabulary [0, 512)");
  ExpectHas(r.out, "dataset data (--data-path " + data + ")");
  ExpectHas(r.out, "of iteration " + std::to_string(iteration));
  ExpectHas(r.out, "keel data verify " + data);
  if (iteration > 1) {  // the iterations before it are kept
    EXPECT_TRUE(fs::exists(Path("run/iter_" + fmt::format("{:07d}", iteration - 1)))) << r.out;
    EXPECT_EQ(ReadText(Path("run/latest_checkpointed_iteration.txt")),
              std::to_string(iteration - 1) + "\n");
  }
}

TEST_F(HostileInputCliTest, Uint16Id65535UnderThePaddedGpt2VocabularyExitsTwoAndKeepsProgress) {
  const std::string data = Path("gpt2data");
  const DatasetMeta gpt2{"gpt2", "", 50257, 50256};
  WriteDataset(data, gpt2, 50257);  // uint16 on disk
  // Token 7 of the 2nd sample of iteration 4 becomes 65535: in the padding of the model's 50304
  // rows, beyond the tokenizer's 50257. Patched into the .bin (the writer refuses such ids).
  const int64_t p = TokenOfSample(data, 3 * 8 + 1, 7);
  {
    std::fstream bin(data + ".bin", std::ios::in | std::ios::out | std::ios::binary);
    bin.seekp(2 * p);
    bin.put(static_cast<char>(0xFF)).put(static_cast<char>(0xFF));
  }
  const keel_test::KeelResult r =
      RunKeelShell("", std::string(kModel) + "--train-iters 10 --save-interval 100 --data-path " +
                           data + " --save " + Path("run"));
  ASSERT_EQ(r.code, 2) << r.out;
  ExpectHas(r.out, "vocab 50257 padded to 50304");
  ExpectHas(r.out, fmt::format("token {} of document {} is id 65535, outside the vocabulary "
                               "[0, 50257) of its tokenizer (gpt2)",
                               p % 40, p / 40));
  ExpectHas(r.out, "training sample 25 of iteration 4");
  ExpectHas(r.out, "keel data verify " + data);
  ExpectHas(r.out, "Iteration 3, the last completed, was saved in " + Path("run"));
  EXPECT_TRUE(fs::exists(Path("run/iter_0000003")));
  EXPECT_FALSE(fs::exists(Path("run/iter_0000004")));
  EXPECT_EQ(ReadText(Path("run/latest_checkpointed_iteration.txt")), "3\n");
}

TEST_F(HostileInputCliTest, AbsurdLearningRatesAreRefusedBeforeTraining) {
  const std::pair<std::string, std::string> cases[] = {
      {"--lr 1e308", "--lr 1e+308 is above 10"},
      {"--lr 11", "--lr 11 is above 10"},
      {"--lr 1e-3 --min-lr 1e308", "--min-lr 1e+308 must be between 0 and --lr 0.001"},
      {"--lr 1e-3 --lr-scale-on-resume 1e308",
       "--lr-scale-on-resume 1e+308 times --lr 0.001 is above 10"}};
  for (const auto& [flags, message] : cases) {
    const keel_test::KeelResult r =
        RunKeelShell("", std::string(kModel) + "--train-iters 4 " + flags);
    EXPECT_EQ(r.code, 2) << flags << "\n" << r.out;
    ExpectHas(r.out, message);
    EXPECT_EQ(r.out.find(" iteration "), std::string::npos) << flags << "\n" << r.out;
  }
}

// A checkpoint with NaN/Inf weights, as a keel without the loop's check could save one: its
// model.safetensors is rewritten through the checkpoint code, so it still verifies as files.
TEST_F(HostileInputCliTest, CheckpointWithNonFiniteWeightsIsNeverExportedSampledOrTrainedOn) {
  const std::string run = Path("run");
  const std::string train = std::string(kModel) + "--train-iters 4 --save " + run;
  keel_test::KeelResult r = RunKeelShell("", train);
  ASSERT_EQ(r.code, 0) << r.out;
  r = RunKeelShell("", "sample --load " + run + " --tokens 4 --threads 1");
  ASSERT_EQ(r.code, 0) << r.out;  // the same checkpoint, finite, samples

  const std::string ckpt = run + "/iter_0000004";
  std::map<std::string, LoadedTensor> tensors;
  ASSERT_TRUE(ReadSafetensors(Env::Default(), ckpt + "/model.safetensors", &tensors, nullptr).ok());
  const std::string planted = "layers.0.mlp.dense_h_to_4h.weight";
  ASSERT_TRUE(tensors.count(planted));
  tensors[planted].data[3] = INFINITY;
  tensors[planted].data[10] = NAN;
  std::vector<TensorView> views;
  for (const auto& [name, t] : tensors) views.push_back({name, t.shape, t.data.data()});
  ASSERT_TRUE(WriteSafetensors(Env::Default(), Path("planted.safetensors"), views, {}).ok());
  ASSERT_TRUE(RewriteCheckpointFiles(Env::Default(), ckpt,
                                     {{"model.safetensors", ReadText(Path("planted.safetensors"))}})
                  .ok());
  const std::string named = "2 NaN or Inf values (2 in " + planted + ", the first tensor";

  r = RunKeelShell("", "ckpt export " + run + " --hf " + Path("hf"));
  EXPECT_EQ(r.code, 1) << r.out;
  ExpectHas(r.out, "refusing to export " + ckpt);
  ExpectHas(r.out, named);
  ExpectHas(r.out, "`keel ckpt list " + run + "` lists them");
  ExpectHas(r.out, "`keel ckpt export " + run + "/iter_N --hf " + Path("hf") + "` exports one");
  EXPECT_FALSE(fs::exists(Path("hf")));
  EXPECT_FALSE(fs::exists(Path("hf.tmp")));

  r = RunKeelShell("", "sample --load " + run + " --tokens 4 --threads 1");
  EXPECT_EQ(r.code, 1) << r.out;
  ExpectHas(r.out, "refusing to load " + ckpt);
  ExpectHas(r.out, named);
  ExpectHas(r.out, "`keel sample --load " + run + "/iter_N` samples from one");

  r = RunKeelShell("", train);  // resumes from it: refused before any iteration
  EXPECT_EQ(r.code, 1) << r.out;
  ExpectHas(r.out, "refusing to continue training from " + ckpt);
  ExpectHas(r.out, named);
  ExpectHas(r.out, "--load " + run + "/iter_N` continues from one");
}

}  // namespace
}  // namespace keel

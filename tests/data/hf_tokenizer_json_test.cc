// Hugging Face tokenizer.json (Megatron's PretrainedFromHF): GPT-2's tokenizer saved by
// transformers gives exactly the GPT-2 tokenizer's ids; BLOOM's kind of pre-tokenizer (a Split
// regex, then ByteLevel without GPT-2's regex) and the Split behaviours cut where the tokenizers
// library cuts; what keel does not implement is refused by name.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "data/tokenizer.h"
#include "data_test_util.h"
#include "hf_tokenizer_json_files.h"

namespace keel {
namespace {

using datatest::Gpt2TokenizerJson;
using datatest::MobyDickDir;
using datatest::ReadTextFile;
using datatest::TempDir;
using datatest::WriteHfFolder;
using json = nlohmann::json;

std::unique_ptr<Tokenizer> Parse(const json& tokenizer, const std::string& eos, Status* st) {
  std::unique_ptr<Tokenizer> tok;
  *st = ParseHfTokenizer(tokenizer.dump(), json{{"eos_token", eos}}.dump(), "", "tokenizer.json",
                         &tok);
  return tok;
}

TEST(HfTokenizerTest, Gpt2TokenizerJsonGivesTheGpt2TokenizersIds) {
  TempDir dir;
  WriteHfFolder(dir.Join("gpt2"), Gpt2TokenizerJson(), "<|endoftext|>");
  std::unique_ptr<Tokenizer> hf, gpt2;
  Status st = LoadHfTokenizer(Env::Default(), dir.Join("gpt2"), &hf);
  ASSERT_TRUE(st.ok()) << st.ToString();
  const std::string assets = DefaultGpt2AssetsDir();
  ASSERT_TRUE(
      LoadGpt2Tokenizer(JoinPath(assets, "encoder.json"), JoinPath(assets, "vocab.bpe"), &gpt2)
          .ok());
  EXPECT_EQ(hf->Kind(), "hf");
  EXPECT_EQ(hf->VocabSize(), 50257);  // len(tokenizer)
  EXPECT_EQ(hf->EodId(), 50256);      // tokenizer_config.json's eos_token
  for (const char* name : {"chapter_1.txt", "chapter_2.txt", "chapter_3.txt"}) {
    const std::string text = ReadTextFile(JoinPath(MobyDickDir(), name));
    ASSERT_FALSE(text.empty()) << name;
    const std::vector<int32_t> ids = hf->Encode(text);
    EXPECT_EQ(ids, gpt2->Encode(text)) << name;
    EXPECT_EQ(hf->Decode(ids), text) << name;
  }
  const std::string odd =
      "Hello world \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x90\xB3 caf\xC3\xA9  \n\n  x\tI'll 12345 -- "
      "ok!! \xFF\xFE invalid";
  EXPECT_EQ(hf->Encode(odd), gpt2->Encode(odd));
  EXPECT_EQ(hf->Decode(hf->Encode(odd)), odd);
  // The special token in text is its id, as tokenizer.encode(text) gives (the GPT-2 BPE alone
  // spells it out in pieces).
  EXPECT_EQ(hf->Encode("a<|endoftext|>b"), (std::vector<int32_t>{64, 50256, 65}));
  EXPECT_NE(gpt2->Encode("a<|endoftext|>b").size(), 3u);
  // The file itself may be named instead of its folder.
  ASSERT_TRUE(LoadHfTokenizer(Env::Default(), dir.Join("gpt2/tokenizer.json"), &hf).ok());
  EXPECT_EQ(hf->EodId(), 50256);
}

// GPT-2's printable alphabet for bytes (bytes_to_unicode), written out independently of keel's.
std::string ByteChar(int b) {
  int cp = b;
  if (!((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)) {
    int n = 0;
    for (int x = 0; x < b; ++x)
      if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE)) ++n;
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// BLOOM's layout: <unk> <s> </s> <pad> at ids 0..3, the 256 bytes at 4..259, then `merges`
// (alphabet strings "a b") each adding its result.
json SmallTokenizer(const json& pre_tokenizer, const std::vector<std::string>& merges) {
  json vocab = json::object();
  json added = json::array();
  int id = 0;
  for (const char* special : {"<unk>", "<s>", "</s>", "<pad>"}) {
    added.push_back({{"id", id},
                     {"content", special},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
    vocab[special] = id++;
  }
  for (int b = 0; b < 256; ++b) vocab[ByteChar(b)] = id++;
  for (const std::string& m : merges) {
    const size_t sp = m.find(' ');
    vocab[m.substr(0, sp) + m.substr(sp + 1)] = id++;
  }
  return {{"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", pre_tokenizer},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"vocab", vocab}, {"merges", merges}}}};
}

int32_t ByteId(char c) {
  return 4 + static_cast<unsigned char>(c);
}

TEST(HfTokenizerTest, BloomStylePreTokenizerCutsAtItsRegexBeforeTheBytes) {
  // BLOOM's pre-tokenizer: Split by " ?[^(\s|[.,!?…。，、।۔،])]+" (isolated), then ByteLevel
  // without GPT-2's regex.
  const json bloom = {{"type", "Sequence"},
                      {"pretokenizers",
                       {{{"type", "Split"},
                         {"pattern", {{"Regex", " ?[^(\\s|[.,!?…。，、।۔،])]+"}}},
                         {"behavior", "Isolated"},
                         {"invert", false}},
                        {{"type", "ByteLevel"},
                         {"add_prefix_space", false},
                         {"trim_offsets", true},
                         {"use_regex", false}}}}};
  const json plain = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  const std::vector<std::string> merges = {"o ,"};  // id 260: "o,"
  Status st;
  auto split = Parse(SmallTokenizer(bloom, merges), "</s>", &st);
  ASSERT_TRUE(st.ok()) << st.ToString();
  auto whole = Parse(SmallTokenizer(plain, merges), "</s>", &st);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(split->VocabSize(), 261);
  EXPECT_EQ(split->EodId(), 2);
  // "o," spans the regex's cut, so only the unsplit tokenizer merges it.
  EXPECT_EQ(split->Encode("no, ok"), (std::vector<int32_t>{ByteId('n'), ByteId('o'), ByteId(','),
                                                           ByteId(' '), ByteId('o'), ByteId('k')}));
  EXPECT_EQ(whole->Encode("no, ok"),
            (std::vector<int32_t>{ByteId('n'), 260, ByteId(' '), ByteId('o'), ByteId('k')}));
  // Special tokens in text become their ids; everything decodes back.
  EXPECT_EQ(split->Encode("</s>no,"),
            (std::vector<int32_t>{2, ByteId('n'), ByteId('o'), ByteId(',')}));
  EXPECT_EQ(split->Decode(split->Encode("<s>no, ok</s>")), "<s>no, ok</s>");
}

TEST(HfTokenizerTest, SplitBehavioursCutAsTheTokenizersLibraryDocumentsThem) {
  // "the-final--countdown" split at "-": isolated [the,-,final,-,-,countdown], removed
  // [the,final,countdown], merged_with_previous [the-,final-,-,countdown], merged_with_next
  // [the,-final,-,-countdown], contiguous [the,-,final,--,countdown]. Merges that span a cut
  // show where it fell.
  const std::vector<std::string> merges = {"e -", "- f", "- -", "l -", "- c"};
  const int32_t e_dash = 260, dash_f = 261, dash_dash = 262, l_dash = 263, dash_c = 264;
  const int32_t d = ByteId('-');
  auto ids_of = [&](const char* behavior) {
    const json pre = {{"type", "Sequence"},
                      {"pretokenizers",
                       {{{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}},
                        {{"type", "ByteLevel"}, {"use_regex", false}}}}};
    Status st;
    auto tok = Parse(SmallTokenizer(pre, merges), "</s>", &st);
    EXPECT_TRUE(st.ok()) << st.ToString();
    std::vector<int32_t> out;
    for (int32_t id : tok->Encode("the-final--countdown"))
      if (id >= 260 || id == d) out.push_back(id);  // the dashes and merges only
    return out;
  };
  EXPECT_EQ(ids_of("Isolated"), (std::vector<int32_t>{d, d, d}));
  EXPECT_EQ(ids_of("Removed"), (std::vector<int32_t>{}));
  EXPECT_EQ(ids_of("MergedWithPrevious"), (std::vector<int32_t>{e_dash, l_dash, d}));
  EXPECT_EQ(ids_of("MergedWithNext"), (std::vector<int32_t>{dash_f, d, dash_c}));
  EXPECT_EQ(ids_of("Contiguous"), (std::vector<int32_t>{d, dash_dash}));
}

// A pattern that backtracks without end on some text (a hostile or careless tokenizer.json) is
// stopped by PCRE2's match limits: the rest of the text is one piece, and every byte still
// becomes a token (nothing is lost, nothing hangs).
TEST(HfTokenizerTest, CatastrophicBacktrackingRegexEndsAndLosesNoText) {
  const json pre = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", "(a|aa)+$"}}}, {"behavior", "Isolated"}},
        {{"type", "ByteLevel"}, {"use_regex", false}}}}};
  Status st;
  auto tok = Parse(SmallTokenizer(pre, {}), "</s>", &st);
  ASSERT_TRUE(st.ok()) << st.ToString();
  const std::string text = std::string(60, 'a') + "b";
  const std::vector<int32_t> ids = tok->Encode(text);
  EXPECT_EQ(ids.size(), text.size());
  EXPECT_EQ(tok->Decode(ids), text);
}

TEST(HfTokenizerTest, WhatKeelDoesNotImplementIsRefusedByName) {
  const json base = SmallTokenizer({{"type", "ByteLevel"}, {"use_regex", true}}, {"Ġ t"});
  struct Case {
    const char* what;
    std::function<void(json*)> edit;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"WordPiece", [](json* j) { (*j)["model"]["type"] = "WordPiece"; }, "model type 'WordPiece'"},
      {"normalizer",
       [](json* j) {
         (*j)["normalizer"] = {{"type", "NFC"}};
       },
       "normalizer 'NFC'"},
      {"template",
       [](json* j) {
         (*j)["post_processor"] = {{"type", "TemplateProcessing"}};
       },
       "post_processor 'TemplateProcessing' adds tokens"},
      {"metaspace",
       [](json* j) {
         (*j)["pre_tokenizer"] = {{"type", "Metaspace"}};
       },
       "pre_tokenizer 'Metaspace'"},
      {"dropout", [](json* j) { (*j)["model"]["dropout"] = 0.1; }, "dropout"},
      {"lstrip", [](json* j) { (*j)["added_tokens"][0]["lstrip"] = true; }, "sets lstrip"},
      {"gap", [](json* j) { (*j)["added_tokens"][0]["id"] = 50300; }, "has id 50300"},
      {"dense",
       [](json* j) {
         (*j)["model"]["vocab"].erase("<unk>");
         (*j)["added_tokens"][0]["id"] = 261;
       },
       "no token has id 0"},
      {"missing byte", [](json* j) { (*j)["model"]["vocab"].erase("!"); }, "byte 33"},
      {"bad merge", [](json* j) { (*j)["model"]["merges"][0] = "nonsense"; },
       "model.merges[0] is not"},
  };
  for (const Case& c : cases) {
    json j = base;
    c.edit(&j);
    Status st;
    Parse(j, "</s>", &st);
    EXPECT_FALSE(st.ok()) << c.what;
    EXPECT_NE(st.message().find(c.says), std::string::npos) << c.what << ": " << st.message();
  }
  Status st;
  // Oniguruma's nested classes: a union is flattened (BLOOM's regex, above); a nested negation
  // has no PCRE2 spelling.
  json nested = base;
  nested["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", "[a[^b]]+"}}}, {"behavior", "Isolated"}},
        {{"type", "ByteLevel"}, {"use_regex", false}}}}};
  Parse(nested, "</s>", &st);
  EXPECT_NE(st.message().find("nests a negated character class"), std::string::npos)
      << st.message();
  Parse(base, "<nope>", &st);
  EXPECT_NE(st.message().find("eos_token '<nope>'"), std::string::npos) << st.message();
  std::unique_ptr<Tokenizer> tok;
  st = ParseHfTokenizer(base.dump(), "", "", "x/tokenizer.json", &tok);
  EXPECT_NE(st.message().find("no eos_token"), std::string::npos) << st.message();
  st = ParseHfTokenizer(base.dump(), json{{"eos_token", "</s>"}}.dump(),
                        json{{"eos_token", {{"content", "!"}}}}.dump(), "x/tokenizer.json", &tok);
  EXPECT_NE(st.message().find("make them agree"), std::string::npos) << st.message();
  st = ParseHfTokenizer("{not json", "", "", "x/tokenizer.json", &tok);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  // A Hub name is not a folder: keel does not download.
  st = LoadHfTokenizer(Env::Default(), "bigscience/bloom", &tok);
  EXPECT_NE(st.message().find("not a Hub name"), std::string::npos) << st.message();
  TempDir dir;
  st = LoadHfTokenizer(Env::Default(), dir.path(), &tok);
  EXPECT_NE(st.message().find("tokenizer.json not found"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace keel

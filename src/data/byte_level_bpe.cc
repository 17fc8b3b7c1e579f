#define PCRE2_CODE_UNIT_WIDTH 8
#include "data/byte_level_bpe.h"

#include <pcre2.h>

#include <functional>
#include <limits>

namespace keel {
namespace {

// Enough for any real pre-tokenizer on any real text; a pattern that needs more backtracks
// catastrophically.
constexpr uint32_t kMatchLimit = 10'000'000;
constexpr uint32_t kDepthLimit = 100'000;

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes map to themselves, the other 68 bytes to
// code points 256.. in byte order, so every byte has a visible character in a vocabulary.
const std::unordered_map<uint32_t, uint8_t>& CodePointToByte() {
  static const auto* table = [] {
    auto* t = new std::unordered_map<uint32_t, uint8_t>;
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      (*t)[printable ? b : next++] = static_cast<uint8_t>(b);
    }
    return t;
  }();
  return *table;
}

uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

RegexSplitter::~RegexSplitter() {
  if (code_ != nullptr) pcre2_code_free(code_);
}

Status RegexSplitter::Compile(const std::string& pattern, const std::string& what) {
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  // MATCH_INVALID_UTF: arbitrary bytes are legal input; invalid sequences just never match.
  code_ =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_offset, nullptr);
  if (code_ == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return Status::Corruption(what + ": cannot compile the pre-tokenizer regex at offset " +
                              std::to_string(err_offset) + ": " +
                              reinterpret_cast<const char*>(msg));
  }
  pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // optional: falls back to the interpreter
  return Status::OK();
}

void RegexSplitter::Split(std::string_view text,
                          const std::function<void(std::string_view, bool)>& piece) const {
  KEEL_CHECK(code_ != nullptr, "RegexSplitter used before Compile");
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
  pcre2_match_context* mc = pcre2_match_context_create(nullptr);
  KEEL_CHECK(md != nullptr && mc != nullptr, "out of memory creating PCRE2 match data");
  pcre2_set_match_limit(mc, kMatchLimit);
  pcre2_set_depth_limit(mc, kDepthLimit);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    int rc = pcre2_match(code_, subject, text.size(), pos, 0, md, mc);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      // A pathological run of whitespace can exhaust the JIT stack; the interpreter copes.
      rc = pcre2_match(code_, subject, text.size(), pos, PCRE2_NO_JIT, md, mc);
    }
    if (rc < 0) break;  // no match, or a limit: the rest is one gap
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t begin = ov[0], end = ov[1];
    if (begin < pos || end < begin || end > text.size()) break;  // \K can report such spans
    if (end == begin) {
      // An empty match consumes nothing: step over one byte (kept in the gap) and go on.
      if (begin >= text.size()) break;
      if (begin > pos) piece(text.substr(pos, begin - pos), false);
      piece(text.substr(begin, 1), false);
      pos = begin + 1;
      continue;
    }
    if (begin > pos) piece(text.substr(pos, begin - pos), false);
    piece(text.substr(begin, end - begin), true);
    pos = end;
  }
  if (pos < text.size()) piece(text.substr(pos), false);
  pcre2_match_context_free(mc);
  pcre2_match_data_free(md);
}

bool ByteLevelBpe::AlphabetToBytes(std::string_view s, std::string* out) {
  const auto& cp_to_byte = CodePointToByte();
  out->clear();
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    uint32_t cp;
    if (c < 0x80) {
      cp = c;
      i += 1;
    } else if ((c >> 5) == 0x6 && i + 1 < s.size()) {
      cp = ((c & 0x1Fu) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3Fu);
      i += 2;
    } else {
      return false;  // the alphabet only uses code points < 0x800
    }
    auto it = cp_to_byte.find(cp);
    if (it == cp_to_byte.end()) return false;
    out->push_back(static_cast<char>(it->second));
  }
  return true;
}

Status ByteLevelBpe::Init(const std::unordered_map<std::string, int32_t>& vocab,
                          const std::vector<std::pair<std::string, std::string>>& merges,
                          const std::string& what, bool ignore_merges) {
  for (int b = 0; b < 256; ++b) {
    auto it = vocab.find(std::string(1, static_cast<char>(b)));
    if (it == vocab.end())
      return Status::Corruption(what + " lacks the single-byte token for byte " +
                                std::to_string(b) + ": a byte-level vocabulary needs all 256");
    byte_id_[b] = it->second;
  }
  merges_.clear();
  int32_t rank = 0;
  for (const auto& [left, right] : merges) {
    auto l = vocab.find(left), r = vocab.find(right), m = vocab.find(left + right);
    if (l == vocab.end() || r == vocab.end() || m == vocab.end())
      return Status::Corruption(what + ": merge " + std::to_string(rank) +
                                " uses a token missing from the vocabulary");
    // A repeated pair keeps its first (best) rank, as a dict built from the list in order does.
    merges_.emplace(PairKey(l->second, r->second), Merge{rank, m->second});
    ++rank;
  }
  ignore_merges_ = ignore_merges;
  if (ignore_merges) whole_words_ = vocab;
  return Status::OK();
}

void ByteLevelBpe::EncodeWord(std::string_view word, std::vector<int32_t>* ids) const {
  if (ignore_merges_) {
    auto it = whole_words_.find(std::string(word));
    if (it != whole_words_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  constexpr size_t kMaxCachedWord = 64;
  CacheShard* shard = nullptr;
  if (word.size() <= kMaxCachedWord) {
    shard = &cache_[std::hash<std::string_view>()(word) % kCacheShards];
    std::lock_guard<std::mutex> lock(shard->mu);
    auto it = shard->words.find(std::string(word));
    if (it != shard->words.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> symbols(word.size());
  for (size_t i = 0; i < word.size(); ++i) symbols[i] = byte_id_[static_cast<uint8_t>(word[i])];
  ApplyMerges(&symbols);
  ids->insert(ids->end(), symbols.begin(), symbols.end());
  if (shard != nullptr) {
    std::lock_guard<std::mutex> lock(shard->mu);
    // Bounded memory on huge corpora.
    if (shard->words.size() >= kMaxCacheEntriesPerShard) shard->words.clear();
    shard->words.emplace(std::string(word), std::move(symbols));
  }
}

// Repeatedly merges the adjacent pair with the lowest rank (all its occurrences, left to right),
// exactly like encoder.py's bpe().
void ByteLevelBpe::ApplyMerges(std::vector<int32_t>* symbols) const {
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

}  // namespace keel

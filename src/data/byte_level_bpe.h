// Byte-level BPE, the model of GPT-2's tokenizer and of Hugging Face's ByteLevel BPE tokenizers
// (BLOOM's among them): a pre-token's UTF-8 bytes start as single-byte tokens and the ranked
// merges are applied lowest rank first (all occurrences of the best pair, left to right), as
// OpenAI's encoder.py and the tokenizers library do. Vocabularies spell bytes in GPT-2's
// printable alphabet (bytes_to_unicode). Shared by gpt2_tokenizer.cc and hf_tokenizer_json.cc.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/status.h"

typedef struct pcre2_real_code_8 pcre2_code_8;

namespace keel {

// GPT-2's pre-tokenizer (also Hugging Face's ByteLevel pre-tokenizer with use_regex).
inline constexpr char kGpt2PreTokenizerPattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// A pre-tokenizer regex (PCRE2, Unicode classes) that cuts text into the pieces it matches and
// the gaps between them. Arbitrary bytes are legal input: invalid UTF-8 never matches, so it ends
// up in a gap; a match that exceeds PCRE2's limits (a hostile pattern from a file) leaves the rest
// of the text as one gap instead of running without end.
class RegexSplitter {
 public:
  RegexSplitter() = default;
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // `what` names the pattern's origin in errors.
  Status Compile(const std::string& pattern, const std::string& what);
  // Calls piece(text, is_match) for every gap and match of `text`, in order, none empty.
  void Split(std::string_view text,
             const std::function<void(std::string_view, bool is_match)>& piece) const;

 private:
  pcre2_code_8* code_ = nullptr;
};

class ByteLevelBpe {
 public:
  // A vocabulary string of GPT-2's byte alphabet as its raw bytes; false when a character is not
  // in the alphabet.
  static bool AlphabetToBytes(std::string_view s, std::string* out);

  // `vocab`: raw bytes -> id; `merges`: (left, right) raw bytes, best (rank 0) first. Every
  // single byte must have a token, and every merge's parts and result must be in `vocab`;
  // `what` names the files in errors. `ignore_merges`: a pre-token that is itself in the
  // vocabulary is that token (Hugging Face's option, used by Llama 3).
  Status Init(const std::unordered_map<std::string, int32_t>& vocab,
              const std::vector<std::pair<std::string, std::string>>& merges,
              const std::string& what, bool ignore_merges = false);

  // Appends the ids of one pre-token (its raw bytes). Thread-safe.
  void EncodeWord(std::string_view word, std::vector<int32_t>* ids) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };
  void ApplyMerges(std::vector<int32_t>* symbols) const;

  // The word cache is split in shards with a lock each, so parallel encoders rarely wait.
  static constexpr size_t kCacheShards = 64;
  static constexpr size_t kMaxCacheEntriesPerShard = 1 << 14;
  struct CacheShard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>> words;
  };

  std::unordered_map<std::string, int32_t> whole_words_;  // the vocabulary, with ignore_merges
  bool ignore_merges_ = false;
  std::array<int32_t, 256> byte_id_{};
  std::unordered_map<uint64_t, Merge> merges_;
  mutable std::array<CacheShard, kCacheShards> cache_;
};

}  // namespace keel

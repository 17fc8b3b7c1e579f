// A Hugging Face tokenizer from its tokenizer.json (Megatron's --tokenizer-type PretrainedFromHF
// with --tokenizer-name-or-path DIR): byte-level BPE as GPT-2's and BLOOM's tokenizers are. The
// text is cut at the added tokens (special tokens in the text become their ids, as
// tokenizer.encode(text) does), each remaining segment goes through the pre-tokenizer (ByteLevel
// with or without GPT-2's regex, Split by a regex or string, or a Sequence of them), and each piece
// through the BPE model (data/byte_level_bpe.h). The EOD id is the tokenizer's eos_token, from
// tokenizer_config.json or special_tokens_map.json beside it, as transformers reads it; the
// vocabulary size is len(tokenizer): the model's vocabulary plus the added tokens. What keel does
// not implement (normalizers, other models and pre-tokenizers, post-processors that add tokens,
// BPE dropout) is refused by name rather than encoded differently. (The tokenizer files an HF
// export writes and an import recognises are hf/hf_tokenizer_files.h.)
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/env.h"
#include "data/byte_level_bpe.h"
#include "data/tokenizer.h"

namespace keel {
namespace {

using json = nlohmann::json;

// The tokenizers library's SplitDelimiterBehavior.
enum class SplitBehavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct PreTokenizerStep {
  enum class Kind { kByteLevel, kSplit } kind = Kind::kByteLevel;
  bool add_prefix_space = false;         // ByteLevel
  std::unique_ptr<RegexSplitter> regex;  // ByteLevel with use_regex (GPT-2's), or Split's Regex
  std::string literal;                   // Split's String pattern
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
};

std::string Type(const json& node) {
  return node.is_object() && node.contains("type") && node["type"].is_string()
             ? node["type"].get<std::string>()
             : std::string();
}

bool IsTrue(const json& node, const char* key) {
  return node.is_object() && node.contains(key) && node[key].is_boolean() && node[key].get<bool>();
}

// A component of tokenizer.json that keel does not implement.
Status Unsupported(const std::string& origin, const std::string& what) {
  return Status::InvalidArgument(fmt::format(
      "{}: {}; keel reads byte-level BPE tokenizers (GPT-2's, BLOOM's, Llama 3's kind) and "
      "refuses what it would encode differently from the tokenizers library",
      origin, what));
}

// The tokenizers library compiles its regexes with Oniguruma, where a '[' inside a character
// class opens a nested class (a union: BLOOM's " ?[^(\s|[.,!?…])]+"); PCRE2 reads that '[' as a
// literal and the class as closed early. Nested unions are flattened into their class; a nested
// negation or an intersection (&&), which cannot be, is refused.
Status OnigurumaToPcre2(const std::string& in, const std::string& origin, std::string* out) {
  out->clear();
  int depth = 0;  // character classes open at this point
  for (size_t i = 0; i < in.size(); ++i) {
    const char c = in[i];
    if (c == '\\' && i + 1 < in.size()) {
      *out += c;
      *out += in[++i];
      continue;
    }
    if (depth == 0) {
      if (c == '[') {
        depth = 1;
        *out += c;
        // A ']' right after '[' or '[^' is a literal member.
        if (i + 1 < in.size() && in[i + 1] == '^') *out += in[++i];
        if (i + 1 < in.size() && in[i + 1] == ']') *out += in[++i];
        continue;
      }
      *out += c;
      continue;
    }
    if (c == '[' && i + 1 < in.size() && in[i + 1] == ':') {  // POSIX [:alpha:] stays
      const size_t end = in.find(":]", i + 2);
      if (end == std::string::npos)
        return Status::InvalidArgument(origin + ": unclosed [: in regex");
      *out += in.substr(i, end + 2 - i);
      i = end + 1;
      continue;
    }
    if (c == '[') {
      if (i + 1 < in.size() && in[i + 1] == '^')
        return Status::InvalidArgument(
            origin +
            ": the regex nests a negated character class ([...[^...]...]), which keel "
            "cannot translate from Oniguruma to PCRE2");
      ++depth;  // a nested union: its members join the enclosing class
      continue;
    }
    if (c == '&' && i + 1 < in.size() && in[i + 1] == '&')
      return Status::InvalidArgument(origin +
                                     ": the regex intersects character classes (&&), which keel "
                                     "cannot translate from Oniguruma to PCRE2");
    if (c == ']') {
      --depth;
      if (depth == 0) *out += c;
      continue;
    }
    *out += c;
  }
  return Status::OK();
}

class HfTokenizer : public Tokenizer {
 public:
  Status Init(const std::string& tokenizer_json, const std::string& tokenizer_config,
              const std::string& special_tokens_map, const std::string& origin) {
    origin_ = origin;
    const json doc = json::parse(tokenizer_json, nullptr, /*allow_exceptions=*/false);
    if (!doc.is_object())
      return Status::InvalidArgument(origin + " is not a JSON object (a tokenizer.json file)");
    // Ids are dense (checked below), so none can exceed the number of entries: that bounds what
    // a hostile id can make keel allocate.
    if (doc.contains("model") && doc["model"].is_object() && doc["model"].contains("vocab"))
      max_entries_ += doc["model"]["vocab"].size();
    if (doc.contains("added_tokens")) max_entries_ += doc["added_tokens"].size();
    KEEL_RETURN_IF_ERROR(ReadModel(doc.contains("model") ? doc["model"] : json()));
    KEEL_RETURN_IF_ERROR(
        ReadAddedTokens(doc.contains("added_tokens") ? doc["added_tokens"] : json()));
    KEEL_RETURN_IF_ERROR(CheckDense());
    const json none;
    const json& normalizer = doc.contains("normalizer") ? doc["normalizer"] : none;
    if (!normalizer.is_null() &&
        !(Type(normalizer) == "Sequence" && normalizer.contains("normalizers") &&
          normalizer["normalizers"].is_array() && normalizer["normalizers"].empty()))
      return Unsupported(origin, "normalizer '" + Type(normalizer) + "' is not implemented");
    KEEL_RETURN_IF_ERROR(
        ReadPreTokenizer(doc.contains("pre_tokenizer") ? doc["pre_tokenizer"] : none));
    KEEL_RETURN_IF_ERROR(
        CheckPostProcessor(doc.contains("post_processor") ? doc["post_processor"] : none));
    const json& decoder = doc.contains("decoder") ? doc["decoder"] : none;
    if (!decoder.is_null() && Type(decoder) != "ByteLevel")
      return Unsupported(origin, "decoder '" + Type(decoder) + "' is not implemented");
    return ReadEos(tokenizer_config, special_tokens_map);
  }

  std::string Kind() const override { return "hf"; }
  int VocabSize() const override { return static_cast<int>(id_to_bytes_.size()); }
  int32_t EodId() const override { return eos_id_; }

  std::vector<int32_t> Encode(const std::string& text) const override {
    std::vector<int32_t> ids;
    ids.reserve(text.size() / 3 + 8);
    std::string_view rest(text);
    while (!rest.empty()) {
      size_t at = rest.size(), len = 0;
      int32_t added = -1;
      FindAddedToken(rest, &at, &len, &added);
      if (at > 0) EncodeSegment(rest.substr(0, at), &ids);
      if (added < 0) break;
      ids.push_back(added);
      rest.remove_prefix(at + len);
    }
    return ids;
  }

  // Ids outside the vocabulary (e.g. sampled from the padded part of the logits) decode to nothing.
  std::string Decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    for (int32_t id : ids)
      if (id >= 0 && id < static_cast<int32_t>(id_to_bytes_.size())) out += id_to_bytes_[id];
    return out;
  }

 private:
  Status Bad(const std::string& what) const {
    return Status::InvalidArgument(origin_ + ": " + what);
  }

  Status ReadModel(const json& model) {
    if (!model.is_object()) return Bad("no \"model\" object");
    const std::string type = Type(model);
    if (type != "BPE" && !(type.empty() && model.contains("merges")))
      return Unsupported(origin_, "model type '" + type + "' is not BPE");
    if (model.contains("dropout") && !model["dropout"].is_null() &&
        !(model["dropout"].is_number() && model["dropout"].get<double>() == 0))
      return Unsupported(origin_, "BPE dropout is on (a tokenizer for training, not for data)");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (model.contains(key) && !model[key].is_null() &&
          !(model[key].is_string() && model[key].get<std::string>().empty()))
        return Unsupported(origin_, fmt::format("the BPE model's {} is set", key));
    if (IsTrue(model, "byte_fallback"))
      return Unsupported(origin_,
                         "the BPE model's byte_fallback is on (a SentencePiece-style BPE)");
    if (!model.contains("vocab") || !model["vocab"].is_object() || model["vocab"].empty())
      return Bad("model.vocab is not an object of token -> id");
    std::unordered_map<std::string, int32_t> bytes_to_id;
    std::string bytes;
    for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
      if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
          it.value().get<int64_t>() >= kMaxIds)
        return Bad("model.vocab: token '" + it.key() + "' has an invalid id");
      const int32_t id = it.value().get<int32_t>();
      KEEL_RETURN_IF_ERROR(Assign(id, it.key(), "model.vocab"));
      // A token outside the byte alphabet cannot come out of byte-level BPE; it decodes as
      // written (an added token's content).
      if (ByteLevelBpe::AlphabetToBytes(it.key(), &bytes)) {
        id_to_bytes_[id] = bytes;
        bytes_to_id.emplace(bytes, id);
      } else {
        id_to_bytes_[id] = it.key();
      }
    }
    if (!model.contains("merges") || !model["merges"].is_array())
      return Bad("model.merges is not a list of merges");
    std::vector<std::pair<std::string, std::string>> merges;
    std::string left, right;
    for (const json& m : model["merges"]) {
      // "left right" (tokenizers < 0.20) or ["left", "right"].
      std::string a, b;
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          return Bad(fmt::format("model.merges[{}] is not \"left right\"", merges.size()));
        a = s.substr(0, sp), b = s.substr(sp + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        a = m[0].get<std::string>(), b = m[1].get<std::string>();
      } else {
        return Bad(
            fmt::format("model.merges[{}] is not \"left right\" or [left, right]", merges.size()));
      }
      if (!ByteLevelBpe::AlphabetToBytes(a, &left) || !ByteLevelBpe::AlphabetToBytes(b, &right))
        return Bad(
            fmt::format("model.merges[{}] is not in the byte-level alphabet", merges.size()));
      merges.emplace_back(left, right);
    }
    return bpe_.Init(bytes_to_id, merges, origin_ + " (model)", IsTrue(model, "ignore_merges"));
  }

  Status Assign(int32_t id, const std::string& token, const char* where) {
    if (static_cast<size_t>(id) >= max_entries_)
      return Bad(fmt::format(
          "{}: token '{}' has id {}, but the file lists {} tokens: keel needs the ids of a "
          "vocabulary to be 0..N-1 without gaps",
          where, token, id, max_entries_));
    if (static_cast<size_t>(id) >= id_to_bytes_.size()) {
      id_to_bytes_.resize(static_cast<size_t>(id) + 1);
      token_of_.resize(static_cast<size_t>(id) + 1);
      assigned_.resize(static_cast<size_t>(id) + 1, false);
    }
    if (assigned_[id] && token_of_[id] != token)
      return Bad(
          fmt::format("{}: tokens '{}' and '{}' share id {}", where, token_of_[id], token, id));
    assigned_[id] = true;
    token_of_[id] = token;
    token_id_.emplace(token, id);
    return Status::OK();
  }

  Status ReadAddedTokens(const json& added) {
    if (added.is_null()) return Status::OK();
    if (!added.is_array()) return Bad("added_tokens is not a list");
    for (const json& t : added) {
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
          t["id"].get<int64_t>() < 0 || t["id"].get<int64_t>() >= kMaxIds ||
          !t.contains("content") || !t["content"].is_string() ||
          t["content"].get<std::string>().empty())
        return Bad("added_tokens holds an entry without an id and a non-empty content");
      const std::string content = t["content"].get<std::string>();
      for (const char* opt : {"single_word", "lstrip", "rstrip"})
        if (IsTrue(t, opt))
          return Unsupported(origin_, fmt::format("added token '{}' sets {}", content, opt));
      const int32_t id = t["id"].get<int32_t>();
      KEEL_RETURN_IF_ERROR(Assign(id, content, "added_tokens"));
      id_to_bytes_[id] = content;
      added_.emplace_back(content, id);
    }
    // Longest first, so that at one position the longest added token wins (as the library's
    // leftmost-longest matching does).
    std::sort(added_.begin(), added_.end(),
              [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
    return Status::OK();
  }

  // Every id from 0 to the largest is a token: len(tokenizer) is then the vocabulary size.
  Status CheckDense() const {
    for (size_t id = 0; id < assigned_.size(); ++id)
      if (!assigned_[id])
        return Bad(fmt::format(
            "no token has id {} (ids run to {}): keel needs the ids of a vocabulary to be "
            "0..N-1 without gaps",
            id, assigned_.size() - 1));
    return Status::OK();
  }

  Status ReadPreTokenizer(const json& pre) {
    std::vector<const json*> steps;
    if (Type(pre) == "Sequence") {
      if (!pre.contains("pretokenizers") || !pre["pretokenizers"].is_array())
        return Bad("pre_tokenizer Sequence has no pretokenizers list");
      for (const json& p : pre["pretokenizers"]) steps.push_back(&p);
    } else if (!pre.is_null()) {
      steps.push_back(&pre);
    }
    bool byte_level = false;
    for (const json* p : steps) {
      PreTokenizerStep step;
      const std::string type = Type(*p);
      if (type == "ByteLevel") {
        byte_level = true;
        step.kind = PreTokenizerStep::Kind::kByteLevel;
        step.add_prefix_space = IsTrue(*p, "add_prefix_space");
        // use_regex defaults to true (GPT-2's pattern).
        const bool use_regex = !(p->contains("use_regex") && (*p)["use_regex"].is_boolean() &&
                                 !(*p)["use_regex"].get<bool>());
        if (use_regex) {
          step.regex = std::make_unique<RegexSplitter>();
          KEEL_RETURN_IF_ERROR(step.regex->Compile(kGpt2PreTokenizerPattern, origin_));
        }
      } else if (type == "Split") {
        step.kind = PreTokenizerStep::Kind::kSplit;
        const json& pattern = p->contains("pattern") ? (*p)["pattern"] : json();
        if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string()) {
          std::string pcre;
          KEEL_RETURN_IF_ERROR(
              OnigurumaToPcre2(pattern["Regex"].get<std::string>(), origin_ + " (Split)", &pcre));
          step.regex = std::make_unique<RegexSplitter>();
          KEEL_RETURN_IF_ERROR(step.regex->Compile(pcre, origin_ + " (Split)"));
        } else if (pattern.is_object() && pattern.contains("String") &&
                   pattern["String"].is_string() && !pattern["String"].get<std::string>().empty()) {
          step.literal = pattern["String"].get<std::string>();
        } else {
          return Bad("pre_tokenizer Split has no Regex or String pattern");
        }
        static const std::map<std::string, SplitBehavior> kBehaviors = {
            {"Isolated", SplitBehavior::kIsolated},
            {"Removed", SplitBehavior::kRemoved},
            {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
            {"MergedWithNext", SplitBehavior::kMergedWithNext},
            {"Contiguous", SplitBehavior::kContiguous}};
        const std::string behavior = p->contains("behavior") && (*p)["behavior"].is_string()
                                         ? (*p)["behavior"].get<std::string>()
                                         : std::string();
        auto b = kBehaviors.find(behavior);
        if (b == kBehaviors.end())
          return Bad("pre_tokenizer Split has an unknown behavior '" + behavior + "'");
        step.behavior = b->second;
        step.invert = IsTrue(*p, "invert");
      } else {
        return Unsupported(origin_, "pre_tokenizer '" + type + "' is not implemented");
      }
      steps_.push_back(std::move(step));
    }
    if (!byte_level)
      return Unsupported(origin_,
                         "the pre_tokenizer has no ByteLevel step, so the model is not byte-level");
    return Status::OK();
  }

  Status CheckPostProcessor(const json& post) const {
    if (post.is_null() || Type(post) == "ByteLevel") return Status::OK();
    if (Type(post) == "Sequence" && post.contains("processors") && post["processors"].is_array()) {
      for (const json& p : post["processors"])
        if (Type(p) != "ByteLevel")
          return Unsupported(origin_, "post_processor '" + Type(p) +
                                          "' adds tokens to every text, which keel does not do");
      return Status::OK();
    }
    return Unsupported(origin_, "post_processor '" + Type(post) +
                                    "' adds tokens to every text, which keel does not do");
  }

  // eos_token of tokenizer_config.json or special_tokens_map.json: a string, or an AddedToken
  // object with its "content".
  Status ReadEos(const std::string& config_text, const std::string& map_text) {
    std::optional<std::string> eos;
    std::string from;
    for (const auto& [text, name] : {std::pair{config_text, "tokenizer_config.json"},
                                     std::pair{map_text, "special_tokens_map.json"}}) {
      if (text.empty()) continue;
      const json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (!doc.is_object())
        return Bad(std::string("its ") + name + " beside it is not a JSON object");
      if (!doc.contains("eos_token") || doc["eos_token"].is_null()) continue;
      const json& e = doc["eos_token"];
      std::optional<std::string> value;
      if (e.is_string()) value = e.get<std::string>();
      if (e.is_object() && e.contains("content") && e["content"].is_string())
        value = e["content"].get<std::string>();
      if (!value)
        return Bad(std::string(name) + ": eos_token is not a string or {\"content\": ...}");
      if (eos && *eos != *value)
        return Bad(fmt::format("{} names eos_token '{}' but {} names '{}': make them agree", from,
                               *eos, name, *value));
      eos = value;
      from = name;
    }
    if (!eos)
      return Bad(
          "no eos_token in tokenizer_config.json or special_tokens_map.json beside it: Megatron "
          "ends every document with it (the EOD token); add e.g. {\"eos_token\": \"</s>\"} to "
          "tokenizer_config.json");
    auto it = token_id_.find(*eos);
    if (it == token_id_.end())
      return Bad(fmt::format("eos_token '{}' ({}) is not a token of the vocabulary", *eos, from));
    eos_id_ = it->second;
    return Status::OK();
  }

  // The earliest added token in `text` (the longest at that position): its offset, length and id.
  void FindAddedToken(std::string_view text, size_t* at, size_t* len, int32_t* id) const {
    if (added_.empty()) return;
    for (size_t pos = 0; pos < text.size(); ++pos)
      for (const auto& [content, tid] : added_)
        if (text.compare(pos, content.size(), content) == 0) {
          *at = pos, *len = content.size(), *id = tid;
          return;
        }
  }

  // One segment between added tokens: through every pre-tokenizer step, then the BPE model.
  void EncodeSegment(std::string_view segment, std::vector<int32_t>* ids) const {
    std::vector<std::string> pieces{std::string(segment)}, next;
    for (const PreTokenizerStep& step : steps_) {
      next.clear();
      for (std::string& piece : pieces) {
        if (step.kind == PreTokenizerStep::Kind::kByteLevel) {
          if (step.add_prefix_space && (piece.empty() || piece[0] != ' ')) piece = " " + piece;
          if (!step.regex) {
            next.push_back(std::move(piece));
            continue;
          }
          step.regex->Split(piece, [&](std::string_view p, bool) { next.emplace_back(p); });
        } else {
          SplitPiece(step, piece, &next);
        }
      }
      pieces.swap(next);
    }
    for (const std::string& p : pieces)
      if (!p.empty()) bpe_.EncodeWord(p, ids);
  }

  static void SplitPiece(const PreTokenizerStep& step, const std::string& piece,
                         std::vector<std::string>* out) {
    std::vector<std::pair<std::string_view, bool>> parts;  // (text, is the delimiter)
    auto add = [&](std::string_view p, bool match) { parts.emplace_back(p, match != step.invert); };
    if (step.regex) {
      step.regex->Split(piece, add);
    } else {
      std::string_view rest(piece);
      while (!rest.empty()) {
        const size_t at = rest.find(step.literal);
        if (at == std::string_view::npos) break;
        if (at > 0) add(rest.substr(0, at), false);
        add(rest.substr(at, step.literal.size()), true);
        rest.remove_prefix(at + step.literal.size());
      }
      if (!rest.empty()) add(rest, false);
    }
    const size_t first = out->size();
    bool pending_next = false;  // MergedWithNext: the last piece waits for the next one
    bool last_was_delim = false;
    for (const auto& [text, delim] : parts) {
      switch (step.behavior) {
        case SplitBehavior::kIsolated:
          out->emplace_back(text);
          break;
        case SplitBehavior::kRemoved:
          if (!delim) out->emplace_back(text);
          break;
        case SplitBehavior::kMergedWithPrevious:
          if (delim && out->size() > first && !last_was_delim)
            out->back() += text;
          else
            out->emplace_back(text);
          break;
        case SplitBehavior::kMergedWithNext:
          if (pending_next && !delim)
            out->back() += text;
          else
            out->emplace_back(text);
          pending_next = delim;
          break;
        case SplitBehavior::kContiguous:
          if (delim && last_was_delim && out->size() > first)
            out->back() += text;
          else
            out->emplace_back(text);
          break;
      }
      last_was_delim = delim;
    }
  }

  static constexpr int64_t kMaxIds = int64_t{1} << 30;

  std::string origin_;
  size_t max_entries_ = 0;
  std::vector<std::string> id_to_bytes_, token_of_;
  std::vector<bool> assigned_;
  std::unordered_map<std::string, int32_t> token_id_;
  std::vector<std::pair<std::string, int32_t>> added_;
  std::vector<PreTokenizerStep> steps_;
  ByteLevelBpe bpe_;
  int32_t eos_id_ = -1;
};

}  // namespace

Status ParseHfTokenizer(const std::string& tokenizer_json, const std::string& tokenizer_config,
                        const std::string& special_tokens_map, const std::string& origin,
                        std::unique_ptr<Tokenizer>* out) {
  auto tok = std::make_unique<HfTokenizer>();
  KEEL_RETURN_IF_ERROR(tok->Init(tokenizer_json, tokenizer_config, special_tokens_map, origin));
  *out = std::move(tok);
  return Status::OK();
}

Status LoadHfTokenizer(Env* env, const std::string& path, std::unique_ptr<Tokenizer>* out) {
  // A folder (as --tokenizer-name-or-path names one), or its tokenizer.json itself.
  const bool dir = env->IsDirectory(path);
  const std::string folder =
      dir ? path
          : (path.rfind('/') == std::string::npos ? std::string(".")
                                                  : path.substr(0, path.rfind('/')));
  const std::string file = dir ? JoinPath(path, "tokenizer.json") : path;
  if (!env->FileExists(file)) {
    if (!env->FileExists(path))
      return Status::InvalidArgument(fmt::format(
          "--tokenizer-name-or-path {}: no such folder; keel reads a local Hugging Face tokenizer "
          "folder (tokenizer.json, tokenizer_config.json), not a Hub name: download it first "
          "(e.g. `huggingface-cli download NAME --local-dir DIR`) and pass DIR",
          path));
    return Status::InvalidArgument(
        fmt::format("--tokenizer-name-or-path {}: {} not found; keel reads the fast tokenizer's "
                    "tokenizer.json (save it with tokenizer.save_pretrained(DIR) in transformers)",
                    path, file));
  }
  std::string text, config, map;
  KEEL_RETURN_IF_ERROR(env->ReadFileToString(file, &text, kMaxTokenizerFileBytes));
  for (auto [name, dest] :
       {std::pair{"tokenizer_config.json", &config}, std::pair{"special_tokens_map.json", &map}}) {
    const std::string p = JoinPath(folder, name);
    if (env->FileExists(p))
      KEEL_RETURN_IF_ERROR(env->ReadFileToString(p, dest, kMaxTokenizerConfigBytes));
  }
  return ParseHfTokenizer(text, config, map, file, out);
}

}  // namespace keel

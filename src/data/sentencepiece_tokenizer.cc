// SentencePiece BPE (Kudo & Richardson 2018) trained on the corpus itself. Training reads the
// inputs through keel's Env and feeds them line by line; the model is written through the Env too.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <exception>
#include <string_view>
#include <unordered_map>

#include "core/env.h"
#include "data/tokenizer.h"

namespace keel {
namespace {

constexpr char kEodPiece[] = "<eod>";

// Feeds the non-empty lines of already-read documents to the trainer.
class LineIterator : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(const std::vector<std::string>* docs) : docs_(docs) { Advance(); }
  bool done() const override { return doc_ >= docs_->size(); }
  void Next() override { Advance(); }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return sentencepiece::util::Status(); }

 private:
  // Moves to the next non-empty line; lines never include their '\n'.
  void Advance() {
    while (doc_ < docs_->size()) {
      std::string_view doc((*docs_)[doc_]);
      if (pos_ >= doc.size()) {
        ++doc_;
        pos_ = 0;
        continue;
      }
      size_t nl = doc.find('\n', pos_);
      if (nl == std::string_view::npos) nl = doc.size();
      std::string_view line = doc.substr(pos_, nl - pos_);
      pos_ = nl + 1;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.empty()) continue;
      line_.assign(line);
      return;
    }
  }

  const std::vector<std::string>* docs_;
  size_t doc_ = 0, pos_ = 0;
  std::string line_;
};

class SentencePieceTokenizer : public Tokenizer {
 public:
  Status Init(const std::string& model_path) {
    std::string serialized;
    KEEL_RETURN_IF_ERROR(Env::Default()->ReadFileToString(model_path, &serialized));
    // The library throws from its trie builder on some malformed models (an empty or NUL piece):
    // a hostile file must be an error, never a terminate().
    sentencepiece::util::Status st;
    try {
      st = sp_.LoadFromSerializedProto(serialized);
    } catch (const std::exception& e) {
      st = sentencepiece::util::Status(sentencepiece::util::StatusCode::kDataLoss, e.what());
    }
    if (!st.ok()) {
      return Status::Corruption(
          "cannot load SentencePiece model '" + model_path + "': " + st.ToString() +
          " (re-create it with `keel data prepare --tokenizer sentencepiece`)");
    }
    eod_id_ = sp_.PieceToId(kEodPiece);
    if (eod_id_ == sp_.unk_id() || !sp_.IsControl(eod_id_)) {
      // Another's model (Megatron's SentencePieceTokenizer, Llama's): its end-of-sentence piece
      // ends documents, as Megatron-LM's GPT SentencePiece tokenizer does.
      const int eos = sp_.eos_id();
      if (eos < 0 || eos >= sp_.GetPieceSize())
        return Status::Corruption("SentencePiece model '" + model_path +
                                  "' has neither keel's control piece " + kEodPiece +
                                  " nor an end-of-sentence piece to end documents with");
      eod_id_ = eos;
      eod_note_ = "SentencePiece model " + model_path + " has no " + kEodPiece +
                  " piece (keel did not train it): documents end with its end-of-sentence "
                  "piece '" +
                  sp_.IdToPiece(eos) + "' (id " + std::to_string(eos) +
                  "), as Megatron-LM's GPT SentencePiece tokenizer does";
    }
    // Encode and Decode cannot return an error, so a model they would fail on is refused here:
    // a probe with every byte value (byte fallback covers what the pieces do not).
    std::string probe = "Call me Ishmael.\n";
    for (int b = 1; b < 256; ++b) probe.push_back(static_cast<char>(b));
    std::vector<int> ids;
    std::string text;
    sentencepiece::util::Status pst;
    try {
      pst = sp_.Encode(probe, &ids);
      if (pst.ok()) pst = sp_.Decode(ids, &text);
    } catch (const std::exception& e) {
      pst = sentencepiece::util::Status(sentencepiece::util::StatusCode::kDataLoss, e.what());
    }
    if (!pst.ok()) {
      return Status::Corruption("SentencePiece model '" + model_path +
                                "' loads but cannot encode text: " + pst.ToString());
    }
    return Status::OK();
  }

  std::string Kind() const override { return "sentencepiece"; }
  int VocabSize() const override { return sp_.GetPieceSize(); }
  int32_t EodId() const override { return eod_id_; }

  std::vector<int32_t> Encode(const std::string& text) const override {
    std::vector<int> ids;
    auto st = sp_.Encode(text, &ids);
    KEEL_CHECK(st.ok(), "SentencePiece encode failed: " + st.ToString());
    return std::vector<int32_t>(ids.begin(), ids.end());
  }

  // Ids outside the vocabulary (e.g. sampled from the padded part of the logits) decode to nothing.
  std::string Decode(const std::vector<int32_t>& ids) const override {
    std::vector<int> valid;
    valid.reserve(ids.size());
    for (int32_t id : ids) {
      if (id >= 0 && id < sp_.GetPieceSize()) valid.push_back(id);
    }
    std::string text;
    auto st = sp_.Decode(valid, &text);
    KEEL_CHECK(st.ok(), "SentencePiece decode failed: " + st.ToString());
    return text;
  }

  const sentencepiece::SentencePieceProcessor& processor() const { return sp_; }
  const std::string& eod_note() const { return eod_note_; }

 private:
  sentencepiece::SentencePieceProcessor sp_;
  int32_t eod_id_ = -1;
  std::string eod_note_;  // how the EOD piece was chosen, when it is not keel's <eod>
};

}  // namespace

Status TrainSentencePiece(const std::vector<std::string>& input_files,
                          const std::string& model_prefix, int vocab_size, uint64_t seed) {
  if (input_files.empty())
    return Status::InvalidArgument("SentencePiece training needs input files");
  if (vocab_size < 300) {
    return Status::InvalidArgument("SentencePiece vocabulary size " + std::to_string(vocab_size) +
                                   " is too small: it must hold the 256 byte-fallback pieces, "
                                   "the corpus' characters and some merges (use >= 300)");
  }
  Env* env = Env::Default();
  std::vector<std::string> docs(input_files.size());
  for (size_t i = 0; i < input_files.size(); ++i) {
    KEEL_RETURN_IF_ERROR(env->ReadFileToString(input_files[i], &docs[i]));
  }

  // Identity normalisation and kept whitespace make Decode(Encode(text)) == text; "\n" is a
  // user-defined piece so newlines survive as one token each. <eod> is a control piece: no text
  // can encode to it.
  std::unordered_map<std::string, std::string> args = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab_size)},
      {"character_coverage", "1.0"},
      {"byte_fallback", "true"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"max_sentence_length", "1048576"},
      {"input_sentence_size", "0"},  // all lines: no random sampling
      {"shuffle_input_sentence", "false"},
      {"unk_id", "0"},
      {"bos_id", "-1"},
      {"eos_id", "-1"},
      {"pad_id", "-1"},
      {"control_symbols", kEodPiece},
      {"user_defined_symbols", "\n"},
      {"num_threads", "2"},
      {"minloglevel", "2"},  // errors only: training is otherwise chatty on stderr
  };
  // 0xFFFFFFFF is reserved by SentencePiece for "seed from std::random_device".
  uint32_t sp_seed = static_cast<uint32_t>(seed ^ (seed >> 32));
  if (sp_seed == 0xFFFFFFFFu) sp_seed = 0;
  sentencepiece::SetRandomGeneratorSeed(sp_seed);

  LineIterator lines(&docs);
  std::string serialized;
  auto st = sentencepiece::SentencePieceTrainer::Train(args, &lines, &serialized);
  if (!st.ok()) {
    return Status::InvalidArgument("SentencePiece training (vocab " + std::to_string(vocab_size) +
                                   ") failed: " + st.ToString());
  }
  KEEL_RETURN_IF_ERROR(WriteFileAtomic(env, model_prefix + ".model", serialized));

  // The .vocab file (piece<TAB>score) is for people reading the vocabulary, as spm_train writes it.
  sentencepiece::SentencePieceProcessor sp;
  auto lst = sp.LoadFromSerializedProto(serialized);
  if (!lst.ok())
    return Status::Internal("trained SentencePiece model does not load: " + lst.ToString());
  std::string vocab;
  for (int i = 0; i < sp.GetPieceSize(); ++i) {
    std::string piece = sp.IdToPiece(i);
    if (piece == "\n") piece = "\\n";
    vocab += piece + "\t" + std::to_string(sp.GetScore(i)) + "\n";
  }
  return WriteFileAtomic(env, model_prefix + ".vocab", vocab);
}

Status LoadSentencePieceTokenizer(const std::string& model_path, std::unique_ptr<Tokenizer>* out,
                                  std::string* eod_note) {
  if (!Env::Default()->FileExists(model_path)) {
    return Status::NotFound("SentencePiece model '" + model_path + "' not found");
  }
  auto tok = std::make_unique<SentencePieceTokenizer>();
  KEEL_RETURN_IF_ERROR(tok->Init(model_path));
  if (eod_note != nullptr) *eod_note = tok->eod_note();
  *out = std::move(tok);
  return Status::OK();
}

}  // namespace keel

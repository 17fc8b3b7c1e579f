#include "data/prepare.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <omp.h>

#include <cstdio>
#include <exception>
#include <nlohmann/json.hpp>

namespace keel {
namespace {

// Documents are read and encoded in batches this large, in parallel within a batch.
constexpr size_t kBatchBytes = 8 << 20;
constexpr size_t kBatchDocs = 256;
constexpr uint64_t kProgressIntervalMicros = 100000;  // at most ~10 redraws per second

std::string DirName(const std::string& path) {
  auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string BaseName(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string HumanBytes(double bytes) {
  if (bytes >= 1e9) return fmt::format("{:.2f} GB", bytes / 1e9);
  if (bytes >= 1e6) return fmt::format("{:.1f} MB", bytes / 1e6);
  if (bytes >= 1e3) return fmt::format("{:.1f} KB", bytes / 1e3);
  return fmt::format("{:.0f} B", bytes);
}

// One-line progress bar redrawn in place with '\r'; Finish() ends the line.
class ProgressBar {
 public:
  ProgressBar(Env* env, bool enabled, int64_t total_bytes)
      : env_(env), enabled_(enabled), total_bytes_(total_bytes), start_(env->NowMicros()) {}

  void Update(int64_t bytes, int64_t docs, int64_t tokens, bool force) {
    if (!enabled_) return;
    const uint64_t now = env_->NowMicros();
    if (!force && now - last_draw_ < kProgressIntervalMicros) return;
    last_draw_ = now;
    const double secs = std::max(1e-6, (now - start_) / 1e6);
    const double pct = total_bytes_ > 0 ? 100.0 * bytes / total_bytes_ : 100.0;
    const int width = 24, filled = static_cast<int>(pct / 100.0 * width + 0.5);
    std::string line =
        fmt::format("\rprepare [{}{}] {:5.1f}% {} / {} | {} docs | {:.1f}k tokens/s   ",
                    std::string(filled, '#'), std::string(width - filled, '.'), pct,
                    HumanBytes(bytes), HumanBytes(total_bytes_), docs, tokens / secs / 1e3);
    std::fwrite(line.data(), 1, line.size(), stderr);
    std::fflush(stderr);
    drawn_ = true;
  }

  void Finish() {
    if (enabled_ && drawn_) {
      std::fputc('\n', stderr);
      std::fflush(stderr);
    }
  }

 private:
  Env* env_;
  bool enabled_;
  int64_t total_bytes_;
  uint64_t start_;
  uint64_t last_draw_ = 0;
  bool drawn_ = false;
};

Status PrepareMegatron(Env* env, const PrepareOptions& options, int workers, uint64_t t0,
                       PrepareStats* stats);

// OK when `input` is a regular file; names what it is otherwise (`flag`: how the user gave it).
Status CheckInputFile(Env* env, const std::string& flag, const std::string& input) {
  FileType type = FileType::kOther;
  const Status st = env->GetFileType(input, &type);
  if (st.code() == Status::Code::kNotFound)
    return Status::NotFound("data prepare: " + flag + " '" + input + "' not found");
  if (!st.ok()) return Status::InvalidArgument("data prepare: " + flag + " " + st.message());
  if (type == FileType::kDirectory)
    return Status::InvalidArgument("data prepare: " + flag + " '" + input +
                                   "' is a directory, not a file");
  if (type != FileType::kRegular)
    return Status::InvalidArgument("data prepare: " + flag + " " +
                                   NotRegularFile(input, type).message() +
                                   " (e.g. `cat a.jsonl b.jsonl > all.jsonl`, then --input "
                                   "all.jsonl); nothing was written");
  return Status::OK();
}

// The offset of the first byte of `text` that does not belong to a well-formed UTF-8 sequence
// (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF), or npos.
size_t FirstInvalidUtf8(std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xbf;  // the range of the second byte
    if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      if (c == 0xe0) lo = 0xa0;
      if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;
    } else {
      return i;
    }
    if (i + len > n || p[i + 1] < lo || p[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k)
      if (p[i + k] < 0x80 || p[i + k] > 0xbf) return i;
    i += len;
  }
  return std::string_view::npos;
}

}  // namespace

Status PrepareDataset(Env* env, const PrepareOptions& options, PrepareStats* stats) {
  const uint64_t t0 = env->NowMicros();
  PrepareStats local;
  if (stats == nullptr) stats = &local;
  *stats = PrepareStats();
  if (options.workers < 0 || options.workers > 1024)
    return Status::InvalidArgument("data prepare: --workers " + std::to_string(options.workers) +
                                   " must be between 0 (all cores) and 1024");
  const int workers = options.workers > 0 ? options.workers : omp_get_max_threads();
  stats->workers = workers;
  if (options.megatron.given()) return PrepareMegatron(env, options, workers, t0, stats);
  if (options.inputs.empty()) return Status::InvalidArgument("data prepare: no input files given");
  if (options.output_prefix.empty()) {
    return Status::InvalidArgument("data prepare: no output prefix given");
  }
  if (!options.tokenizer_model.empty() && options.tokenizer != "sentencepiece")
    return Status::InvalidArgument(
        "data prepare: --tokenizer-model is a sentencepiece model; "
        "pass --tokenizer sentencepiece with it");
  if (options.tokenizer != "gpt2" && options.tokenizer != "sentencepiece") {
    return Status::InvalidArgument("data prepare: unknown tokenizer '" + options.tokenizer +
                                   "' (expected gpt2 or sentencepiece)");
  }
  int64_t total_bytes = 0;
  for (const std::string& input : options.inputs) {
    uint64_t size = 0;
    const Status cs = CheckInputFile(env, "input file", input);
    if (cs.code() == Status::Code::kInvalidArgument && env->IsDirectory(input))
      return Status::NotFound("data prepare: input file '" + input + "' not found");
    KEEL_RETURN_IF_ERROR(cs);
    KEEL_RETURN_IF_ERROR(env->GetFileSize(input, &size));
    total_bytes += static_cast<int64_t>(size);
  }
  if (total_bytes == 0 && !options.allow_empty)
    return Status::InvalidArgument(fmt::format(
        "data prepare: the input{} hold{} no text (0 bytes): a dataset of empty documents "
        "trains nothing; give the right files, or pass --allow-empty to write it anyway; "
        "nothing was written",
        options.inputs.size() == 1 ? " " + options.inputs[0] : "s",
        options.inputs.size() == 1 ? "s" : ""));
  const std::string& prefix = options.output_prefix;
  KEEL_RETURN_IF_ERROR(env->CreateDirs(DirName(prefix)));

  std::unique_ptr<Tokenizer> tokenizer;
  DatasetMeta meta;
  meta.tokenizer = options.tokenizer;
  if (options.tokenizer == "gpt2") {
    const std::string dir =
        options.gpt2_assets_dir.empty() ? DefaultGpt2AssetsDir() : options.gpt2_assets_dir;
    KEEL_RETURN_IF_ERROR(
        LoadGpt2Tokenizer(JoinPath(dir, "encoder.json"), JoinPath(dir, "vocab.bpe"), &tokenizer));
  } else if (!options.tokenizer_model.empty()) {
    std::string model;
    Status rs = env->ReadFileToString(options.tokenizer_model, &model);
    if (!rs.ok())
      return Status::NotFound("data prepare: --tokenizer-model " + options.tokenizer_model +
                              " cannot be read: " + rs.message());
    Status ls = LoadSentencePieceTokenizer(options.tokenizer_model, &tokenizer);
    if (!ls.ok())
      return Status::InvalidArgument("data prepare: --tokenizer-model " + options.tokenizer_model +
                                     " is not a sentencepiece model: " + ls.message());
    KEEL_RETURN_IF_ERROR(WriteFileAtomic(env, prefix + ".model", model));
    meta.tokenizer_model = BaseName(prefix) + ".model";
  } else {
    if (options.progress) {
      std::string line =
          fmt::format("prepare: training SentencePiece BPE (vocab {}) on {} of text\n",
                      options.vocab_size, HumanBytes(total_bytes));
      std::fwrite(line.data(), 1, line.size(), stderr);
      std::fflush(stderr);
    }
    KEEL_RETURN_IF_ERROR(
        TrainSentencePiece(options.inputs, prefix, options.vocab_size, options.seed));
    KEEL_RETURN_IF_ERROR(LoadSentencePieceTokenizer(prefix + ".model", &tokenizer));
    meta.tokenizer_model = BaseName(prefix) + ".model";
  }
  meta.vocab_size = tokenizer->VocabSize();
  meta.eod_id = tokenizer->EodId();
  stats->vocab_size = meta.vocab_size;
  stats->tokenizer_seconds = (env->NowMicros() - t0) / 1e6;

  stats->outputs.push_back(prefix);
  const uint64_t t_encode = env->NowMicros();
  IndexedDatasetWriter writer(env, prefix, meta.vocab_size);
  KEEL_RETURN_IF_ERROR(writer.Open());
  ProgressBar bar(env, options.progress, total_bytes);
  bar.Update(0, 0, 0, /*force=*/true);
  const size_t n = options.inputs.size();
  std::vector<std::string> texts;
  std::vector<std::vector<int32_t>> ids;
  for (size_t first = 0; first < n;) {
    // Read a batch in order, encode it in parallel, append it in order.
    texts.clear();
    size_t batch_bytes = 0;
    while (first + texts.size() < n && texts.size() < kBatchDocs && batch_bytes < kBatchBytes) {
      texts.emplace_back();
      KEEL_RETURN_IF_ERROR(
          env->ReadFileToString(options.inputs[first + texts.size() - 1], &texts.back()));
      batch_bytes += texts.back().size();
    }
    ids.assign(texts.size(), {});
    std::vector<std::string> errors(texts.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(workers)
    for (size_t i = 0; i < texts.size(); ++i) {
      try {
        ids[i] = tokenizer->Encode(texts[i]);
        ids[i].push_back(meta.eod_id);
      } catch (const std::exception& e) {  // exceptions must not escape an OpenMP region
        errors[i] = e.what();
      }
    }
    for (size_t i = 0; i < texts.size(); ++i) {
      if (!errors[i].empty()) {
        return Status::Internal("data prepare: encoding '" + options.inputs[first + i] +
                                "' failed: " + errors[i]);
      }
      KEEL_RETURN_IF_ERROR(writer.AddDocument(ids[i]));
      stats->documents += 1;
      stats->bytes += static_cast<int64_t>(texts[i].size());
      stats->tokens += static_cast<int64_t>(ids[i].size());
      bar.Update(stats->bytes, stats->documents, stats->tokens, /*force=*/false);
    }
    first += texts.size();
  }
  KEEL_RETURN_IF_ERROR(writer.Finish(meta));
  bar.Update(stats->bytes, stats->documents, stats->tokens, /*force=*/true);
  bar.Finish();
  stats->encode_seconds = (env->NowMicros() - t_encode) / 1e6;
  stats->seconds = (env->NowMicros() - t0) / 1e6;
  return Status::OK();
}

Status ExtractJsonDocument(std::string_view line, const std::vector<std::string>& keys,
                           const std::string& where, std::vector<std::string>* texts) {
  texts->clear();
  const nlohmann::json doc = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    const size_t bad = FirstInvalidUtf8(line);
    if (bad != std::string_view::npos)
      return Status::InvalidArgument(fmt::format(
          "{}: invalid UTF-8 at byte offset {} of the line (byte 0x{:02x}): JSON text is UTF-8; "
          "re-encode the file (e.g. `iconv -f latin1 -t utf-8`)",
          where, bad, static_cast<unsigned char>(line[bad])));
  }
  if (!doc.is_object())
    return Status::InvalidArgument(
        where +
        ": not a JSON object: loose JSON input holds one object per line, e.g. "
        "{\"text\": \"...\"} (what Megatron's tools/preprocess_data.py reads)");
  for (const std::string& key : keys) {
    auto it = doc.find(key);
    if (it == doc.end() || !it->is_string()) {
      std::string have;
      for (auto k = doc.begin(); k != doc.end() && have.size() < 200; ++k)
        have += (have.empty() ? "" : ", ") + k.key();
      return Status::InvalidArgument(
          fmt::format("{}: {} (keys: {}); name the text's key with --json-keys", where,
                      it == doc.end() ? "no key '" + key + "'" : "'" + key + "' is not a string",
                      have.empty() ? "none" : have));
    }
    texts->push_back(it->get<std::string>());
  }
  return Status::OK();
}

namespace {

// Megatron's tools/preprocess_data.py: loose JSON lines, one dataset per key.
Status PrepareMegatron(Env* env, const PrepareOptions& options, int workers, uint64_t t0,
                       PrepareStats* stats) {
  if (options.inputs.empty()) return Status::InvalidArgument("data prepare: no --input given");
  if (options.output_prefix.empty())
    return Status::InvalidArgument("data prepare: no --output-prefix given");
  if (options.json_keys.empty())
    return Status::InvalidArgument("data prepare: --json-keys names no key");
  for (size_t i = 0; i < options.json_keys.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (options.json_keys[i] == options.json_keys[j])
        return Status::InvalidArgument("data prepare: --json-keys names '" + options.json_keys[i] +
                                       "' twice");
  int64_t total_bytes = 0;
  for (const std::string& input : options.inputs) {
    uint64_t size = 0;
    const Status cs = CheckInputFile(env, "--input", input);
    if (cs.code() == Status::Code::kNotFound || env->IsDirectory(input))
      return Status::InvalidArgument("data prepare: --input '" + input + "' is not a file");
    KEEL_RETURN_IF_ERROR(cs);
    KEEL_RETURN_IF_ERROR(env->GetFileSize(input, &size));
    total_bytes += static_cast<int64_t>(size);
  }
  std::unique_ptr<Tokenizer> tok;
  KEEL_RETURN_IF_ERROR(LoadTokenizerFromSpec(env, options.megatron, &tok, &stats->notes));
  const DatasetMeta meta = MetaForSpec(options.megatron, *tok);
  stats->vocab_size = meta.vocab_size;
  stats->tokenizer_seconds = (env->NowMicros() - t0) / 1e6;
  const uint64_t t_encode = env->NowMicros();
  KEEL_RETURN_IF_ERROR(env->CreateDirs(DirName(options.output_prefix)));
  const size_t nk = options.json_keys.size();
  std::vector<std::unique_ptr<IndexedDatasetWriter>> writers;
  for (const std::string& key : options.json_keys) {
    // Megatron's names: the tr8 and tr1 scripts' DATA_PATH is .../meg-gpt2_text_document.
    const std::string prefix = options.output_prefix + "_" + key + "_document";
    writers.push_back(std::make_unique<IndexedDatasetWriter>(env, prefix, meta.vocab_size));
    KEEL_RETURN_IF_ERROR(writers.back()->Open());
    stats->outputs.push_back(prefix);
  }
  ProgressBar bar(env, options.progress, total_bytes);
  bar.Update(0, 0, 0, /*force=*/true);
  std::vector<std::string_view> lines;
  std::vector<std::string> where;
  std::vector<std::vector<std::vector<int32_t>>> ids;  // [line][key]
  std::vector<std::string> errors;
  std::string input;
  int64_t line_no = 0;
  // Tokenizes and appends the complete lines of `rest`.
  auto add_lines = [&](std::string_view rest) -> Status {
    while (!rest.empty()) {
      // A batch of lines, read in order, tokenized in parallel, appended in order: the output
      // is the same for any number of workers.
      lines.clear();
      where.clear();
      size_t batch_bytes = 0;
      while (!rest.empty() && lines.size() < kBatchDocs && batch_bytes < kBatchBytes) {
        const size_t nl = rest.find('\n');
        std::string_view line = rest.substr(0, nl);
        rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
        ++line_no;
        stats->bytes += static_cast<int64_t>(line.size()) + (nl == std::string_view::npos ? 0 : 1);
        batch_bytes += line.size();
        if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;  // blank
        lines.push_back(line);
        where.push_back(input + ":" + std::to_string(line_no));
      }
      ids.assign(lines.size(), std::vector<std::vector<int32_t>>(nk));
      errors.assign(lines.size(), std::string());
#pragma omp parallel for schedule(dynamic, 1) num_threads(workers)
      for (size_t i = 0; i < lines.size(); ++i) {
        try {
          std::vector<std::string> texts;
          Status st = ExtractJsonDocument(lines[i], options.json_keys, where[i], &texts);
          if (!st.ok()) {
            errors[i] = st.message();
            continue;
          }
          for (size_t k = 0; k < nk; ++k) {
            ids[i][k] = tok->Encode(texts[k]);
            if (!ids[i][k].empty() && options.append_eod) ids[i][k].push_back(meta.eod_id);
          }
        } catch (const std::exception& e) {  // exceptions must not escape an OpenMP region
          errors[i] = where[i] + ": " + e.what();
        }
      }
      for (size_t i = 0; i < lines.size(); ++i) {
        if (!errors[i].empty()) return Status::InvalidArgument("data prepare: " + errors[i]);
        for (size_t k = 0; k < nk; ++k) {
          if (ids[i][k].empty()) {  // as preprocess_data.py: nothing to add
            ++stats->empty_skipped;
            continue;
          }
          KEEL_RETURN_IF_ERROR(writers[k]->AddDocument(ids[i][k]));
          stats->tokens += static_cast<int64_t>(ids[i][k].size());
        }
        ++stats->documents;
        bar.Update(stats->bytes, stats->documents, stats->tokens, /*force=*/false);
      }
    }
    return Status::OK();
  };
  std::string text, piece;
  for (const std::string& file : options.inputs) {
    input = file;
    line_no = 0;
    uint64_t size = 0;
    KEEL_RETURN_IF_ERROR(env->GetFileSize(input, &size));
    // Read in pieces with read(2), not mapped: a file truncated under the reader ends early
    // (and is named) where a mapping would kill the process with SIGBUS.
    uint64_t offset = 0;
    text.clear();  // what was read and not yet tokenized: the start of a line, then a piece
    for (bool end = false; !end;) {
      KEEL_RETURN_IF_ERROR(env->ReadFileRange(input, offset, kBatchBytes, &piece));
      end = piece.empty();
      if (end && offset < size)  // before its cut-off last line is taken for a document
        return Status::IOError(fmt::format(
            "data prepare: {} shrank from {} to {} bytes while it was read (truncated or "
            "rewritten by another process): nothing was written; run it again once the file is "
            "complete",
            input, size, offset));
      offset += piece.size();
      text += piece;
      // Up to the last newline, or all of it at the end of the file.
      const size_t last_nl = text.rfind('\n');
      const size_t complete = end ? text.size() : last_nl == std::string::npos ? 0 : last_nl + 1;
      if (text.size() - complete > kMaxJsonLineBytes)
        return Status::InvalidArgument(fmt::format(
            "data prepare: {}:{}: a line longer than {} (the most keel reads as one document): "
            "is it loose JSON, one object per line?",
            input, line_no + 1, FormatByteCap(kMaxJsonLineBytes)));
      KEEL_RETURN_IF_ERROR(add_lines(std::string_view(text).substr(0, complete)));
      text.erase(0, complete);
    }
  }
  if (stats->tokens == 0 && !options.allow_empty)
    return Status::InvalidArgument(fmt::format(
        "data prepare: {}: nothing to write: {}; an empty dataset trains nothing (an empty "
        "file, or a pipe read as empty?); give the right input, or pass --allow-empty to write "
        "it anyway; nothing was written",
        fmt::join(options.inputs, ", "),
        stats->documents == 0
            ? std::string("no JSON lines (the input holds only blank lines, or "
                          "nothing)")
            : fmt::format("its {} documents all tokenized to nothing", stats->documents)));
  for (auto& w : writers) KEEL_RETURN_IF_ERROR(w->Finish(meta));
  bar.Update(stats->bytes, stats->documents, stats->tokens, /*force=*/true);
  bar.Finish();
  stats->encode_seconds = (env->NowMicros() - t_encode) / 1e6;
  stats->seconds = (env->NowMicros() - t0) / 1e6;
  return Status::OK();
}

}  // namespace

std::string TokenizerModelPath(const std::string& prefix, const DatasetMeta& meta) {
  if (meta.tokenizer_model.empty()) return "";
  return meta.tokenizer_model[0] == '/' ? meta.tokenizer_model
                                        : JoinPath(DirName(prefix), meta.tokenizer_model);
}

Status LoadTokenizerForDataset(const std::string& prefix, const DatasetMeta& meta,
                               std::unique_ptr<Tokenizer>* out) {
  std::unique_ptr<Tokenizer> tok;
  if (meta.tokenizer == "gpt2") {
    const std::string dir = DefaultGpt2AssetsDir();
    KEEL_RETURN_IF_ERROR(LoadGpt2Tokenizer(
        meta.vocab_file.empty() ? JoinPath(dir, "encoder.json") : meta.vocab_file,
        meta.merge_file.empty() ? JoinPath(dir, "vocab.bpe") : meta.merge_file, &tok));
  } else if (meta.tokenizer == "hf") {
    if (meta.tokenizer_model.empty())
      return Status::Corruption("dataset '" + prefix +
                                "': meta.json names an hf tokenizer but no tokenizer_model folder");
    KEEL_RETURN_IF_ERROR(LoadHfTokenizer(Env::Default(), TokenizerModelPath(prefix, meta), &tok));
  } else if (meta.tokenizer == "sentencepiece") {
    if (meta.tokenizer_model.empty()) {
      return Status::Corruption("dataset '" + prefix +
                                "': meta.json names sentencepiece but no tokenizer_model file");
    }
    KEEL_RETURN_IF_ERROR(LoadSentencePieceTokenizer(TokenizerModelPath(prefix, meta), &tok));
  } else {
    return Status::NotFound("dataset '" + prefix + "' has no " + prefix +
                            ".meta.json naming its tokenizer, so its token ids cannot be decoded; "
                            "prepare it with `keel data prepare`");
  }
  if ((meta.vocab_size > 0 && tok->VocabSize() != meta.vocab_size) ||
      (meta.eod_id >= 0 && tok->EodId() != meta.eod_id)) {
    return Status::Corruption(fmt::format(
        "dataset '{}' was made with a {} tokenizer of vocabulary {} and EOD {}, but the one "
        "found has vocabulary {} and EOD {}",
        prefix, meta.tokenizer, meta.vocab_size, meta.eod_id, tok->VocabSize(), tok->EodId()));
  }
  *out = std::move(tok);
  return Status::OK();
}

}  // namespace keel

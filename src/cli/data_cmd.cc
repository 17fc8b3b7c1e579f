// `keel data prepare`: text files -> Megatron indexed dataset; with --tokenizer-type, Megatron's
// tools/preprocess_data.py (loose JSON lines, --json-keys, --append-eod, --workers).
// `keel data inspect PREFIX`: counts, document lengths, a decoded sample.
// `keel data verify PREFIX`: structure and contents checked; exit 0 clean, 1 not.
#include <CLI/CLI.hpp>
#include <algorithm>

#include "cli/commands.h"
#include "cli/exit_code.h"
#include "cli/usage_exit.h"
#include "core/log.h"
#include "data/dataset_check.h"
#include "data/default_corpus.h"
#include "data/prepare.h"
#include "data/tokenizer.h"

namespace keel::cli {

int DataCommand(int argc, const char* const* argv) {
  CLI::App app("Data tools", "keel data");
  app.require_subcommand(1);
  CLI::App* prep = app.add_subcommand(
      "prepare", "Tokenize text files (one document each) into PREFIX.bin/.idx (MMIDIDX v1)");
  PrepareOptions opt;
  opt.tokenizer = "gpt2";
  opt.vocab_size = 4096;
  opt.gpt2_assets_dir = DefaultGpt2AssetsDir();
  opt.seed = 1234;
  std::string corpus;
  auto* input = prep->add_option("--input", opt.inputs,
                                 "text files, each one document (with --tokenizer-type: loose "
                                 "JSON files, one document per line)")
                    ->check(CLI::ExistingFile);
  prep->add_option("--corpus", corpus,
                   "a bundled corpus instead of --input: moby-dick, or sotu (State of the Union "
                   "addresses, 1790-2021)")
      ->check(CLI::IsMember({"moby-dick", "sotu"}))
      ->excludes(input);
  prep->add_option("--tokenizer-model", opt.tokenizer_model,
                   "sentencepiece: reuse this trained model (e.g. another dataset's PREFIX.model) "
                   "so the datasets can be mixed")
      ->check(CLI::ExistingFile);
  prep->add_option("--output-prefix", opt.output_prefix,
                   "writes PREFIX.bin, PREFIX.idx, PREFIX.meta.json")
      ->required();
  prep->add_option("--tokenizer", opt.tokenizer,
                   "gpt2 (GPT-2 BPE) or sentencepiece (BPE trained on the inputs)")
      ->check(CLI::IsMember({"gpt2", "sentencepiece"}));
  prep->add_option("--vocab-size", opt.vocab_size,
                   "vocabulary size of a trained sentencepiece tokenizer")
      ->check(CLI::Range(300, 1000000));
  prep->add_option("--gpt2-assets", opt.gpt2_assets_dir,
                   "directory with encoder.json and vocab.bpe");
  prep->add_option("--seed", opt.seed, "seed for sentencepiece training");
  bool quiet = false;
  prep->add_flag("--quiet", quiet, "no progress bar");
  prep->add_flag("--allow-empty", opt.allow_empty,
                 "write the dataset even when the input holds no document (refused otherwise)");
  prep->add_option("--workers", opt.workers,
                   "threads tokenizing in parallel (default: all cores; the output is the same "
                   "for any number)")
      ->check(CLI::Range(0, 1024));
  // Megatron's tools/preprocess_data.py: a --tokenizer-type selects its mode.
  const std::string megatron = "Megatron's tools/preprocess_data.py (loose JSON input)";
  prep->add_option("--tokenizer-type", opt.megatron.type,
                   "GPT2BPETokenizer, SentencePieceTokenizer or PretrainedFromHF: --input is "
                   "loose JSON (one object per line), each --json-keys key its own dataset "
                   "PREFIX_KEY_document")
      ->group(megatron);
  prep->add_option("--vocab-file", opt.megatron.vocab_file, "GPT2BPETokenizer: gpt2-vocab.json")
      ->group(megatron);
  prep->add_option("--merge-file", opt.megatron.merge_file, "GPT2BPETokenizer: gpt2-merges.txt")
      ->group(megatron);
  prep->add_option("--tokenizer-name-or-path", opt.megatron.name_or_path,
                   "PretrainedFromHF: a local Hugging Face tokenizer folder")
      ->group(megatron);
  prep->add_option("--json-keys", opt.json_keys, "the keys of the text (default: text)")
      ->expected(1, 1 << 10)
      ->group(megatron);
  prep->add_flag("--append-eod", opt.append_eod, "end every document with the EOD token")
      ->group(megatron);
  std::string dataset_impl = "mmap";
  prep->add_option("--dataset-impl", dataset_impl, "mmap (keel writes MMIDIDX)")->group(megatron);
  bool split_sentences = false, keep_newlines = false;
  prep->add_flag("--split-sentences", split_sentences, "not in keel (needs NLTK's punkt)")
      ->group(megatron);
  prep->add_flag("--keep-newlines", keep_newlines, "with --split-sentences only")->group(megatron);
  int log_interval = 0, divisible_by = 0, pad_to = 0;
  prep->add_option("--log-interval", log_interval, "accepted: keel's progress bar redraws itself")
      ->group(megatron);
  prep->add_option("--make-vocab-size-divisible-by", divisible_by,
                   "accepted: keel pads the vocabulary when it trains")
      ->group(megatron);
  prep->add_option("--pad-vocab-size-to", pad_to,
                   "accepted: keel pads the vocabulary when it trains")
      ->group(megatron);
  std::string prefix;
  int vocab = 0, doc = 0, show = 64;
  CLI::App* inspect = app.add_subcommand(
      "inspect", "Documents, tokens, length histogram and a decoded sample of PREFIX.bin/.idx");
  inspect->add_option("prefix", prefix, "dataset prefix (PREFIX.bin, PREFIX.idx)")->required();
  inspect->add_option("--doc", doc, "document to show decoded (default 0)");
  inspect->add_option("--tokens", show, "tokens of it to show (default 64)");
  CLI::App* verify = app.add_subcommand(
      "verify",
      "Check PREFIX.bin/.idx: structure, token ids below the vocabulary, empty documents");
  verify->add_option("prefix", prefix, "dataset prefix (PREFIX.bin, PREFIX.idx)")->required();
  verify->add_option("--vocab-size", vocab,
                     "vocabulary size to check ids against (default: PREFIX.meta.json's)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return UsageExit(app, e);
  }
  if (inspect->parsed() || verify->parsed()) {
    std::unique_ptr<IndexedDataset> data;
    Status st = IndexedDataset::Open(Env::Default(), prefix, &data);
    if (!st.ok()) {
      const int rc = Fail(st, NotFoundIs::kUsageError);
      if (st.code() == Status::Code::kCorruption || st.code() == Status::Code::kIOError)
        LogError(
            "the dataset cannot be read; rebuild it with `keel data prepare` (or the tool "
            "that wrote it)");
      return rc;
    }
    const DatasetMeta& meta = data->meta();
    const int vocab_size = vocab > 0 ? vocab : meta.vocab_size;
    const DatasetReport r = CheckDataset(*data, vocab_size, meta.eod_id);
    Log("{}: {} documents, {} tokens; document length min {}, max {}, mean {:.1f}", prefix,
        r.documents, r.tokens, r.min_length, r.max_length,
        r.documents ? static_cast<double>(r.tokens) / static_cast<double>(r.documents) : 0.0);
    Log("tokenizer: {} (vocab {}, EOD id {}; {} EOD tokens); ids in [{}, {}]",
        meta.tokenizer.empty() ? "unknown (no PREFIX.meta.json)" : meta.tokenizer, meta.vocab_size,
        meta.eod_id, r.eod_tokens, r.min_id, r.max_id);
    if (inspect->parsed()) {
      Log("document lengths (tokens):");
      const int64_t most = *std::max_element(r.length_buckets.begin(), r.length_buckets.end());
      for (size_t k = 0; k < r.length_buckets.size(); ++k) {
        const int64_t lo = k == 0 ? 0 : int64_t{1} << k, hi = (int64_t{2} << k) - 1;
        Log("  {:>8} - {:<8} {:>8}  {}", lo, hi, r.length_buckets[k],
            std::string(static_cast<size_t>(40 * r.length_buckets[k] / std::max<int64_t>(most, 1)),
                        '#'));
      }
      if (doc < 0 || doc >= r.documents) {
        LogError(fmt::format("error: --doc {} is outside the {} documents", doc, r.documents));
        return 2;
      }
      const int64_t n = std::min<int64_t>(show, data->DocumentLength(doc));
      std::vector<int32_t> ids(static_cast<size_t>(n));
      if (n > 0) data->ReadStream(data->DocumentStarts()[doc], n, ids.data());
      std::string id_text;
      for (int32_t v : ids) id_text += (id_text.empty() ? "" : " ") + std::to_string(v);
      Log("document {} ({} tokens), first {} ids: {}", doc, data->DocumentLength(doc), n, id_text);
      std::unique_ptr<Tokenizer> tok;
      if (!meta.tokenizer.empty() && r.out_of_vocab == 0 &&
          LoadTokenizerForDataset(prefix, meta, &tok).ok())
        Log("decoded:\n{}", tok->Decode(ids));
      else
        Log("(not decoded: {})", meta.tokenizer.empty() ? "no tokenizer is recorded"
                                 : r.out_of_vocab       ? "ids outside the vocabulary"
                                                        : "the tokenizer could not be loaded");
      return 0;
    }
    bool ok = true;
    if (r.documents == 0 || r.tokens == 0) {
      // Nothing to train on is not OK: almost always an empty input prepared by mistake.
      LogError(fmt::format(
          "error: {} holds no {}: training on it has nothing to read; prepare it again from "
          "the right input",
          prefix, r.documents == 0 ? "documents" : "tokens (every document is empty)"));
      Log("verify: FAILED ({} documents, {} tokens)", r.documents, r.tokens);
      return 1;
    }
    if (vocab_size <= 0) {
      LogError("error: the vocabulary size is unknown (no PREFIX.meta.json): pass --vocab-size N");
      return 2;
    }
    if (r.out_of_vocab > 0) {
      ok = false;
      LogError(fmt::format(
          "error: {} token ids are outside the vocabulary [0, {}); the first is {} at token {} of "
          "document {}: the data was tokenized with another vocabulary; re-tokenize it, or pass "
          "the right --vocab-size",
          r.out_of_vocab, vocab_size, r.first_bad_id, r.first_bad_position, r.first_bad_document));
    }
    if (r.empty_documents > 0)
      Log("WARNING: {} empty documents (the first is document {}): they add nothing to training",
          r.empty_documents, r.first_empty_document);
    if (ok)
      Log("verify: OK ({} documents, {} tokens, every id below {})", r.documents, r.tokens,
          vocab_size);
    else
      Log("verify: FAILED ({} documents, {} tokens, vocabulary {})", r.documents, r.tokens,
          vocab_size);
    return ok ? 0 : 1;
  }
  opt.progress = !quiet;
  if (!opt.megatron.type.empty()) {
    // Megatron's mode: what its preprocess_data.py takes.
    if (!corpus.empty() || prep->count("--tokenizer") > 0 || prep->count("--vocab-size") > 0) {
      LogError(
          "error: --tokenizer-type selects Megatron's mode (loose JSON --input); --corpus, "
          "--tokenizer and --vocab-size belong to keel's mode (text files); give one mode's "
          "flags");
      return 2;
    }
    if (split_sentences) {
      LogError(
          "error: --split-sentences is not in keel (Megatron splits with NLTK's punkt, for BERT "
          "and T5 data); GPT pretraining reads whole documents: drop it");
      return 2;
    }
    if (dataset_impl != "mmap") {
      LogError("error: --dataset-impl " + dataset_impl +
               ": keel writes the mmap format (MMIDIDX) only, which Megatron reads too; use "
               "--dataset-impl mmap");
      return 2;
    }
    if (keep_newlines)
      Log("note: --keep-newlines: sentences are not split, so newlines are kept as they are");
    if (divisible_by > 0 || pad_to > 0)
      Log("note: --make-vocab-size-divisible-by / --pad-vocab-size-to: a dataset holds the "
          "tokenizer's ids; keel pads the vocabulary when it trains (keel train takes both)");
    if (log_interval > 0) Log("note: --log-interval: keel's progress bar redraws itself");
    if (opt.inputs.empty()) {
      LogError("error: data prepare --tokenizer-type ... needs --input FILE (loose JSON)");
      return 2;
    }
    opt.megatron.tokenizer_model = opt.tokenizer_model;  // SentencePieceTokenizer's model
    opt.tokenizer_model.clear();
  } else if (prep->count("--json-keys") > 0 || opt.append_eod) {
    LogError(
        "error: --json-keys and --append-eod belong to Megatron's mode: give --tokenizer-type "
        "(and its files), as Megatron's tools/preprocess_data.py takes it");
    return 2;
  }
  if (!opt.megatron.type.empty()) {
    PrepareStats stats;
    Status st = PrepareDataset(Env::Default(), opt, &stats);
    for (const std::string& n : stats.notes) Log("note: {}", n);
    if (!st.ok()) return Fail(st);
    for (const std::string& p : stats.outputs) Log("wrote {}.bin, .idx, .meta.json", p);
    Log("prepared {} documents ({} keys), {} tokens ({} empty documents skipped), {} tokenizer "
        "(vocab {}){}, in {:.2f} s: {:.0f} tokens/s tokenizing with {} workers",
        stats.documents, opt.json_keys.size(), stats.tokens, stats.empty_skipped, opt.megatron.type,
        stats.vocab_size, opt.append_eod ? ", EOD appended" : ", no EOD", stats.seconds,
        stats.tokens / std::max(stats.encode_seconds, 1e-9), stats.workers);
    return 0;
  }
  if (!corpus.empty()) {
    Status cs = CorpusFiles(Env::Default(), corpus, &opt.inputs);
    if (!cs.ok()) return Fail(cs);
    Log("corpus {}: {} documents", corpus, opt.inputs.size());
  } else if (opt.inputs.empty()) {
    LogError("error: data prepare needs --input FILE... or --corpus NAME");
    return 2;
  }
  PrepareStats stats;
  Status st = PrepareDataset(Env::Default(), opt, &stats);
  if (!st.ok()) return Fail(st);
  Log("prepared {}: {} documents, {} tokens ({} tokenizer, vocab {}) in {:.2f} s: {:.0f} tokens/s "
      "tokenizing with {} workers",
      opt.output_prefix, stats.documents, stats.tokens, opt.tokenizer, stats.vocab_size,
      stats.seconds, stats.tokens / std::max(stats.encode_seconds, 1e-9), stats.workers);
  return 0;
}

}  // namespace keel::cli

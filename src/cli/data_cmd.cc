// `keel data prepare`: text files -> Megatron indexed dataset.
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "core/log.h"
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
  prep->add_option("--input", opt.inputs, "text files; each is one document")
      ->required()
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
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  opt.progress = !quiet;
  PrepareStats stats;
  Status st = PrepareDataset(Env::Default(), opt, &stats);
  if (!st.ok()) {
    LogError("error: " + st.message());
    return st.code() == Status::Code::kInvalidArgument ? 2 : 1;
  }
  Log("prepared {}: {} documents, {} tokens ({} tokenizer, vocab {})", opt.output_prefix,
      stats.documents, stats.tokens, opt.tokenizer, stats.vocab_size);
  return 0;
}

}  // namespace keel::cli

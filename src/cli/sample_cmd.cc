// `keel sample`: generate text from the weights of a checkpoint (a run directory's newest valid
// one, or a given iter_NNNNNNN directory).
#include <fmt/format.h>

#include <CLI/CLI.hpp>

#include "backend/registry.h"
#include "checkpoint/train_checkpoint.h"
#include "cli/commands.h"
#include "cli/exit_code.h"
#include "cli/usage_exit.h"
#include "config/config.h"
#include "core/log.h"
#include "model/generate.h"

namespace keel::cli {

int SampleCommand(int argc, const char* const* argv) {
  CLI::App app("Generate text from a checkpoint of `keel train --save DIR`", "keel sample");
  std::string load, prompt = "Call me";
  GenerateOptions go;
  int threads = 0;
  std::string backend_name = TrainConfig().backend;
  app.add_option("--load", load,
                 "run directory (the --save of keel train: its newest valid checkpoint) or "
                 "a checkpoint directory (DIR/iter_NNNNNNN)")
      ->required();
  app.add_option("--prompt", prompt, "text to continue");
  app.add_option("--tokens", go.max_new_tokens, "tokens to generate")
      ->check(CLI::Range(1, kMaxSampleTokens));
  app.add_option("--temperature", go.temperature, "softmax temperature")
      ->check(CLI::Range(0.0, 100.0));
  app.add_option("--top-k", go.top_k, "sample among the k most likely tokens (0: all)");
  app.add_option("--seed", go.seed, "random seed of the draws");
  app.add_option("--threads", threads,
                 fmt::format("CPU threads (0: all cores; at most {})", MaxThreads()));
  app.add_option("--backend", backend_name, "where the ops run (as keel train's --backend)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return UsageExit(app, e);
  }
  if (Status st = ValidateThreads(threads); !st.ok()) return Fail(st);
  Env* env = Env::Default();
  std::unique_ptr<Backend> backend;
  if (Status st = MakeBackend(backend_name, threads, &backend); !st.ok()) return Fail(st);
  LoadedModel run;
  Status st = LoadModelFromCheckpoint(
      env, load, backend.get(), [](const std::string& l) { LogError(l); }, &run);
  if (!st.ok()) return Fail(st, NotFoundIs::kUsageError);  // NotFound: --load holds no checkpoint
  LogError("sampling from " + run.checkpoint_dir);
  std::vector<int32_t> ids = run.tokenizer->Encode(prompt);
  if (ids.empty()) ids.push_back(run.tokenizer->EodId());
  std::vector<int32_t> out = Generate(*run.model, ids, go);
  // Decode prompt and continuation together: decoding the continuation alone would drop the
  // word boundary at its start (SentencePiece strips a leading space).
  ids.insert(ids.end(), out.begin(), out.end());
  LogLine(run.tokenizer->Decode(ids));
  return 0;
}

}  // namespace keel::cli

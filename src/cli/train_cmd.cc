// `keel train`: resolve and validate the config, open the data, build the model on the CPU
// backend, train, save, and print a text sample.
#include <fmt/format.h>

#include <chrono>
#include <cmath>

#include "cli/commands.h"
#include "cli/run_files.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "core/log.h"
#include "data/default_corpus.h"
#include "data/gpt_dataset.h"
#include "data/indexed_dataset.h"
#include "data/prepare.h"
#include "model/generate.h"
#include "train/flops.h"
#include "train/trainer.h"

namespace keel::cli {
namespace {

int Fail(const Status& st) {
  LogError("error: " + st.message());
  return st.code() == Status::Code::kInvalidArgument ? 2 : 1;
}

}  // namespace

int TrainCommand(int argc, const char* const* argv) {
  ParsedConfig parsed;
  Status st = ParseTrainArgs(argc, argv, &parsed);
  if (parsed.help_requested) {
    std::fputs(parsed.help_text.c_str(), stdout);
    return 0;
  }
  if (!st.ok()) return Fail(st);
  Env* env = Env::Default();
  Log("keel {} - training", KEEL_VERSION);
  auto comm = MakeSingleProcessCommunicator();
  // Validate again once the data-parallel size and the vocabulary are known: the defaults that
  // depend on them (global batch, padded vocab) are derived from the config as the user gave it.
  TrainConfig cfg = parsed.as_given;
  cfg.data_parallel_size = comm->world_size();

  // ---- run directory: checked before any work, so a long run never fails at its end ----
  if (!cfg.save.empty()) {
    for (const char* f : {"run.json", "model.safetensors"}) {
      if (env->FileExists(JoinPath(cfg.save, f)))
        return Fail(Status::InvalidArgument(
            "--save " + cfg.save + " already holds a run (" + f +
            "): keel never overwrites a run's files; pass a new --save directory"));
    }
    st = env->CreateDirs(cfg.save);
    if (st.ok()) st = WriteFileAtomic(env, JoinPath(cfg.save, ".keel-write-test"), "ok\n");
    if (st.ok()) st = env->RemoveFile(JoinPath(cfg.save, ".keel-write-test"));
    if (!st.ok())
      return Fail(
          Status::InvalidArgument("--save " + cfg.save + " is not writable: " + st.message()));
  }

  // ---- data ----
  std::string prefix = cfg.data_path;
  std::vector<std::string> notes;
  if (prefix.empty()) {
    const std::string tok = cfg.tokenizer == TokenizerKind::kGpt2 ? "gpt2" : "sentencepiece";
    st = EnsureDefaultCorpus(env, tok, 4096, &prefix, &notes);
    if (!st.ok()) return Fail(st);
  }
  std::unique_ptr<IndexedDataset> data;
  st = IndexedDataset::Open(env, prefix, &data);
  if (!st.ok()) return Fail(st);
  DatasetMeta meta = data->meta();
  if (meta.vocab_size <= 0)
    return Fail(Status::InvalidArgument(
        prefix + ".meta.json is missing, so the vocabulary size of --data-path " + prefix +
        " is unknown: prepare the data with `keel data prepare` (it writes the metadata)"));
  cfg.vocab_size = meta.vocab_size;
  st = Validate(&cfg, &notes);
  if (!st.ok()) return Fail(st);
  for (const std::string& n : notes) Log("note: {}", n);

  std::unique_ptr<GptDataset> train_set, valid_set;
  st = GptDataset::Create(data.get(), cfg.split, Split::kTrain, cfg.seq_length, cfg.seed,
                          &train_set);
  if (!st.ok()) return Fail(st);
  Status vst = GptDataset::Create(data.get(), cfg.split, Split::kValid, cfg.seq_length, cfg.seed,
                                  &valid_set);
  if (!vst.ok()) {
    Warn("no validation set ({}); validation is skipped", vst.message());
    valid_set.reset();
  }
  Log("data: {} ({} documents, {} tokens; train split {} samples of {} tokens per epoch{})", prefix,
      data->NumDocuments(), data->NumTokens(), train_set->SamplesPerEpoch(), cfg.seq_length,
      valid_set ? fmt::format(", validation split {} samples", valid_set->SamplesPerEpoch()) : "");

  if (valid_set && cfg.eval_iters * cfg.global_batch_size > valid_set->SamplesPerEpoch())
    Warn(
        "an evaluation reads --eval-iters {} x global batch {} = {} samples but the validation "
        "split has {}: samples repeat within an evaluation; lower --eval-iters or give the "
        "validation split more weight in --split",
        cfg.eval_iters, cfg.global_batch_size, cfg.eval_iters * cfg.global_batch_size,
        valid_set->SamplesPerEpoch());

  // ---- config, backend, model ----
  Log("resolved config:\n{}", FormatConfig(cfg));
  auto backend = MakeCpuBackend(cfg.threads);
  Log("backend: {}", backend->Describe());
  int64_t last_epoch = 0;
  SampleFn train_fn = [&](int64_t index, int32_t* tokens) {
    const int64_t epoch = train_set->EpochOf(index);
    if (epoch != last_epoch) {
      Log("data: train split exhausted after {} samples; starting epoch {} (new deterministic "
          "order)",
          index, epoch + 1);
      last_epoch = epoch;
    }
    train_set->GetSample(index, tokens);
  };
  SampleFn valid_fn;
  if (valid_set)
    valid_fn = [&](int64_t index, int32_t* tokens) { valid_set->GetSample(index, tokens); };

  Trainer trainer(cfg, backend.get(), comm.get(), env, train_fn, valid_fn);
  const GptSpec& spec = trainer.model().spec();
  const int64_t formula = GptModel::FormulaParamCount(spec);
  Log("model: {} layers, hidden {}, ffn {}, heads {}, positions {}, vocab {} (padded {})",
      spec.num_layers, spec.hidden, spec.ffn_hidden, spec.heads,
      spec.alibi ? "ALiBi" : fmt::format("learned {}", spec.max_positions), spec.vocab,
      spec.padded_vocab);
  Log("parameters: {} (formula n*(12h^2+13h) + v*h + s*h + 2h = {}{})",
      trainer.model().num_params(), formula,
      static_cast<int64_t>(trainer.model().num_params()) == formula
          ? ", equal"
          : ": differs because of the FFN size, ALiBi or the embedding LayerNorm");
  Log("training: {} iterations, {} flops per token", trainer.TotalIterations(),
      fmt::format("{:.3g}", TrainingFlopsPerToken(spec, cfg.seq_length)));
  trainer.InitializeWeights();

  const auto t0 = std::chrono::steady_clock::now();
  st = trainer.Run([](const std::string& line) { LogLine(line); });
  if (!st.ok()) return Fail(st);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Log("training finished: {} iterations in {:.1f} s", trainer.counters().iteration, secs);

  if (!cfg.save.empty()) {
    st = SaveRunFiles(env, cfg.save, trainer.model(), FormatConfig(cfg), prefix, meta);
    if (!st.ok()) return Fail(st);
    Log("saved weights and run files to {} (sample with `keel sample --load {}`)", cfg.save,
        cfg.save);
  }
  if (cfg.sample_tokens > 0) {
    std::unique_ptr<Tokenizer> tok;
    st = LoadTokenizerForDataset(prefix, meta, &tok);
    if (!st.ok()) return Fail(st);
    std::vector<int32_t> prompt = tok->Encode(cfg.sample_prompt);
    if (prompt.empty()) prompt.push_back(tok->EodId());
    GenerateOptions go;
    go.max_new_tokens = cfg.sample_tokens;
    go.seed = cfg.seed;
    go.window = cfg.seq_length;
    std::vector<int32_t> out = Generate(trainer.model(), prompt, go);
    prompt.insert(prompt.end(), out.begin(), out.end());  // decoded together: see sample_cmd.cc
    Log("sample (temperature {}, top-k {}):\n{}", go.temperature, go.top_k, tok->Decode(prompt));
  }
  return 0;
}

}  // namespace keel::cli

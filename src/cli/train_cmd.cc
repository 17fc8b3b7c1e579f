// `keel train`: resolve and validate the config, open the data, build the model on the CPU
// backend, train, save, and print a text sample.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_store.h"
#include "cli/commands.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "core/fault_injection_env.h"
#include "core/log.h"
#include "core/rng.h"
#include "core/stop_signal.h"
#include "data/blended_dataset.h"
#include "data/default_corpus.h"
#include "data/prepare.h"
#include "data/sample_prefetcher.h"
#include "data/train_data.h"
#include "journal/run_journal.h"
#include "metrics/run_metrics.h"
#include "model/generate.h"
#include "train/checkpoint_controller.h"
#include "train/flops.h"
#include "train/guard_controller.h"
#include "train/train_checkpoint.h"
#include "train/trainer.h"

namespace keel::cli {
namespace {

int Fail(const Status& st) {
  LogError("error: " + st.message());
  return st.code() == Status::Code::kInvalidArgument ? 2 : 1;
}

std::string Now() {
  return UtcTimestamp();
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
  // Test hook: KEEL_FAULT_INJECTION arms a fault (e.g. a crash inside a save) in the Env.
  std::unique_ptr<FaultInjectionEnv> fault_env;
  if (const char* spec = std::getenv("KEEL_FAULT_INJECTION"); spec != nullptr && *spec) {
    st = FaultInjectionEnv::FromSpec(spec, env, &fault_env);
    if (!st.ok()) return Fail(st);
    env = fault_env.get();
    Warn("fault injection active (KEEL_FAULT_INJECTION={}): for testing only", spec);
  }
  // Test hook: KEEL_TRAIN_FAULTS="poison=A-B,nan-grad=C-D" replaces the data of iterations A..B
  // with uniformly random tokens and plants a NaN in the gradients of iterations C..D (the
  // guard's end-to-end tests and demos).
  std::vector<std::pair<int64_t, int64_t>> poison, nan_grad;
  if (const char* spec = std::getenv("KEEL_TRAIN_FAULTS"); spec != nullptr && *spec) {
    std::string text = spec;
    size_t pos = 0;
    while (pos <= text.size()) {
      const size_t comma = std::min(text.find(',', pos), text.size());
      const std::string item = text.substr(pos, comma - pos);
      const size_t eq = item.find('=');
      std::vector<std::pair<int64_t, int64_t>> r;
      const std::string key = item.substr(0, eq);
      if (eq == std::string::npos || (key != "poison" && key != "nan-grad") ||
          !ParseIterationRanges({item.substr(eq + 1)}, &r).ok())
        return Fail(Status::InvalidArgument(
            "KEEL_TRAIN_FAULTS=" + text +
            ": expected comma-separated poison=A-B and nan-grad=A-B (iteration ranges)"));
      (key == "poison" ? poison : nan_grad).push_back(r[0]);
      pos = comma + 1;
    }
    Warn("training faults injected (KEEL_TRAIN_FAULTS={}): for testing only", text);
  }
  auto comm = MakeSingleProcessCommunicator();
  // Validate again once the data-parallel size and the vocabulary are known: the defaults that
  // depend on them (global batch, padded vocab) are derived from the config as the user gave it.
  TrainConfig cfg = parsed.as_given;
  cfg.data_parallel_size = comm->world_size();

  // ---- run directory: checked before any work, so a long run never fails at its end ----
  if (!cfg.save.empty()) {
    if (env->FileExists(JoinPath(cfg.save, "run.json")) &&
        !env->FileExists(JoinPath(cfg.save, kMarkerFile)))
      return Fail(Status::InvalidArgument(
          "--save " + cfg.save +
          " holds a run written by an older keel (run.json, no checkpoints) that cannot be "
          "resumed; pass a new --save directory"));
    st = env->CreateDirs(cfg.save);
    if (st.ok()) st = WriteFileAtomic(env, JoinPath(cfg.save, ".keel-write-test"), "ok\n");
    if (st.ok()) st = env->RemoveFile(JoinPath(cfg.save, ".keel-write-test"));
    if (!st.ok())
      return Fail(
          Status::InvalidArgument("--save " + cfg.save + " is not writable: " + st.message()));
  }
  if (!cfg.kill_switch_path.empty() && env->FileExists(cfg.kill_switch_path)) {
    Warn("kill switch {} exists: not training (remove the file to train)", cfg.kill_switch_path);
    return 0;
  }

  // ---- data ----
  std::vector<std::string> notes;
  std::vector<std::pair<double, std::string>> blend;
  if (cfg.data_path.empty()) {  // (a lone "" is normalised away by the config)
    std::string prefix;
    const std::string tok = cfg.tokenizer == TokenizerKind::kGpt2 ? "gpt2" : "sentencepiece";
    st = EnsureDefaultCorpus(env, tok, 4096, &prefix, &notes);
    if (!st.ok()) return Fail(st);
    blend.emplace_back(1.0, prefix);
  } else {
    st = ParseDataBlend(cfg.data_path, &blend);
    if (!st.ok()) return Fail(st);
  }
  std::unique_ptr<TrainData> data;
  st = TrainData::Open(env, blend, cfg.split, cfg.seq_length, cfg.seed, &data);
  if (!st.ok()) return Fail(st);
  const std::string prefix = data->source(0).shards[0];  // its tokenizer is the run's
  DatasetMeta meta = data->meta();
  if (meta.vocab_size <= 0)
    return Fail(Status::InvalidArgument(
        prefix + ".meta.json is missing, so the vocabulary size of --data-path " + prefix +
        " is unknown: prepare the data with `keel data prepare` (it writes the metadata)"));
  cfg.vocab_size = meta.vocab_size;
  cfg.eod_id = meta.eod_id;
  if ((cfg.reset_position_ids || cfg.reset_attention_mask) && meta.eod_id < 0)
    return Fail(Status::InvalidArgument(
        "--reset-position-ids / --reset-attention-mask find documents by their end-of-document "
        "token, but " +
        prefix +
        ".meta.json names none; prepare the data with `keel data "
        "prepare` (it records the EOD id) or drop the flags"));
  st = Validate(&cfg, &notes);
  if (!st.ok()) return Fail(st);
  for (const std::string& n : notes) Log("note: {}", n);

  const bool mixture = data->NumDatasets() > 1;
  bool any_valid = false;
  for (int d = 0; d < data->NumDatasets(); ++d) {
    const TrainData::Source& src = data->source(d);
    Log("data: {} ({}{} documents, {} tokens; train split {} samples of {} tokens per epoch{})",
        mixture ? fmt::format("{} = {} (weight {:.4f})", src.name, src.prefix, src.weight)
                : src.prefix,
        src.shards.size() > 1 ? fmt::format("{} shards, ", src.shards.size()) : "",
        src.data->NumDocuments(), src.data->NumTokens(), src.train->SamplesPerEpoch(),
        cfg.seq_length,
        src.valid ? fmt::format(", validation split {} samples", src.valid->SamplesPerEpoch())
                  : "");
    if (!src.valid) {
      Warn("no validation set for {} ({}); it is not evaluated", src.name, src.valid_missing);
      continue;
    }
    any_valid = true;
    if (cfg.eval_iters * cfg.global_batch_size > src.valid->SamplesPerEpoch())
      Warn(
          "an evaluation of {} reads --eval-iters {} x global batch {} = {} samples but its "
          "validation split has {}: samples repeat within an evaluation; lower --eval-iters or "
          "give the validation split more weight in --split",
          src.name, cfg.eval_iters, cfg.global_batch_size, cfg.eval_iters * cfg.global_batch_size,
          src.valid->SamplesPerEpoch());
  }
  if (mixture)
    Log("data: mixture of {} datasets by error diffusion over the weights: over any window of N "
        "samples each dataset gets its share within 2 samples; the order is a pure function of "
        "(seed, position)",
        data->NumDatasets());
  if (!any_valid) Warn("no dataset has a validation split: validation is skipped");

  // ---- the checkpoint to resume from, if any ----
  // --load SAVE/iter_N inside the run's own --save is a rollback: newer checkpoints are moved
  // aside (kept) and the run continues from iteration N.
  std::string load_dir = cfg.load.empty() ? cfg.save : cfg.load;
  bool rollback = false;
  int64_t rollback_to = -1;
  if (!cfg.load.empty() && env->FileExists(JoinPath(cfg.load, kManifestFile))) {
    namespace fs = std::filesystem;
    const fs::path ld = fs::weakly_canonical(fs::path(cfg.load));
    const std::string name = ld.filename().string();
    if (ld.parent_path() == fs::weakly_canonical(fs::path(cfg.save)) &&
        ParseCheckpointDirName(name, &rollback_to)) {
      rollback = true;
      load_dir = cfg.save;
    }
  }
  if (!cfg.load.empty() && !rollback && load_dir != cfg.save) {
    CheckpointStore save_store(env, cfg.save, nullptr);
    std::vector<CheckpointInfo> existing;
    if (save_store.List(&existing).ok() && !existing.empty())
      return Fail(Status::InvalidArgument(
          "--save " + cfg.save +
          " already holds checkpoints of a run and --load names another directory (" + cfg.load +
          "): drop --load to continue the run in --save, give --load one of --save's own "
          "iter_NNNNNNN directories to roll back to it, or pass a new --save directory"));
  }
  std::unique_ptr<SavedTrainState> saved;
  if (rollback) {
    CheckpointStore store(env, cfg.save, [](const std::string& l) { LogLine(l); });
    st = store.Recover();
    if (st.ok())
      st = VerifyCheckpointDir(env, JoinPath(cfg.save, CheckpointDirName(rollback_to)),
                               /*check_contents=*/true, nullptr);
    if (st.ok()) st = store.RollbackTo(rollback_to);
    if (!st.ok()) return Fail(st);
    saved = std::make_unique<SavedTrainState>();
    st = ReadSavedTrainState(env, JoinPath(cfg.save, CheckpointDirName(rollback_to)), saved.get());
    if (!st.ok()) return Fail(st);
  } else if (!cfg.load.empty() && env->FileExists(JoinPath(cfg.load, kManifestFile))) {
    st = VerifyCheckpointDir(env, cfg.load, /*check_contents=*/true, nullptr);
    if (!st.ok()) return Fail(st);
    saved = std::make_unique<SavedTrainState>();
    st = ReadSavedTrainState(env, cfg.load, saved.get());
    if (!st.ok()) return Fail(st);
  } else if (!load_dir.empty()) {
    CheckpointStore load_store(env, load_dir, [](const std::string& l) { LogLine(l); });
    const bool own = load_dir == cfg.save;
    if (own) {
      st = load_store.Recover();
      if (!st.ok()) return Fail(st);
    }
    CheckpointInfo info;
    st = load_store.FindNewestValid(/*move_aside_rejected=*/own, &info);
    if (st.code() == Status::Code::kNotFound) {
      if (!cfg.load.empty())
        return Fail(Status::InvalidArgument("--load " + cfg.load +
                                            " holds no checkpoint (iter_NNNNNNN directory); "
                                            "check the path, or drop --load to start afresh"));
    } else if (!st.ok()) {
      return Fail(Status::Corruption(
          st.message() + "\nfix or move the broken checkpoints, or pass a new --save directory"));
    } else {
      saved = std::make_unique<SavedTrainState>();
      st = ReadSavedTrainState(env, info.path, saved.get());
      if (!st.ok()) return Fail(st);
    }
  }
  nlohmann::json history = saved ? saved->history : nlohmann::json::array();
  if (saved) {
    std::vector<ConfigChange> changes = DiffConfigForResume(saved->config, cfg), accepted;
    std::vector<std::string> change_notes;
    st = CheckResumeChanges(changes, cfg, &accepted, &change_notes);
    if (!st.ok()) return Fail(Status::InvalidArgument(saved->dir + ": " + st.message()));
    for (const std::string& n : change_notes) Log("note: {}", n);
    nlohmann::json event = {{"event", rollback ? "rollback" : "resume"},
                            {"iteration", saved->counters.iteration},
                            {"at", Now()},
                            {"from", saved->dir},
                            {"keel_version", KEEL_VERSION}};
    for (const ConfigChange& c : accepted) {
      Log("accepted change on resume: {}: {} -> {} ({})", c.key, c.old_value, c.new_value,
          c.kind == ConfigChange::Kind::kScheduler ? "--override-scheduler"
                                                   : "--override-data-order");
      event["accepted_changes"].push_back(
          {{"key", c.key}, {"old", c.old_value}, {"new", c.new_value}});
    }
    history.push_back(event);
  }

  // ---- config, backend, model ----
  Log("resolved config:\n{}", FormatConfig(cfg));
  auto backend = MakeCpuBackend(cfg.threads);
  Log("backend: {}", backend->Describe());
  // Samples are read ahead on a background thread (data/sample_prefetcher.h); the loop's own
  // thread sees each sample's dataset and epoch, and logs a dataset's new epoch as it begins.
  Trainer* trainer_ptr = nullptr;
  const int64_t depth = std::max<int64_t>(
      8, std::min<int64_t>(2 * cfg.global_batch_size,
                           (256 << 20) / (4 * static_cast<int64_t>(cfg.seq_length + 1))));
  SamplePrefetcher prefetcher(
      [&data](int64_t index, uint64_t salt, int32_t* tokens) {
        return data->GetTrainSample(index, salt, tokens);
      },
      cfg.seq_length + 1, depth);
  std::vector<int64_t> last_epoch(static_cast<size_t>(data->NumDatasets()), -1);
  uint64_t last_salt = 0;
  SampleFn train_fn = [&](int64_t index, int32_t* tokens) -> int {
    const int64_t iteration = trainer_ptr ? trainer_ptr->counters().iteration + 1 : 0;
    for (auto [a, b] : poison) {
      if (iteration >= a && iteration <= b) {
        const RngKey key{cfg.seed + 77, RngPurpose::kTest, static_cast<uint64_t>(index)};
        for (int t = 0; t <= cfg.seq_length; ++t)
          tokens[t] = static_cast<int32_t>(U64At(key, t) % static_cast<uint64_t>(cfg.vocab_size));
        return 0;
      }
    }
    // The guard's re-seeding rung raises the trainer's data salt: from then on the samples come
    // from the same splits in the order of seed + salt.
    const uint64_t salt = trainer_ptr ? trainer_ptr->data_salt() : 0;
    if (salt != last_salt) {
      Log("data: order re-seeded (salt {}) from sample {}", salt, index);
      last_salt = salt;
    }
    const SampleOrigin o = prefetcher.Get(index, salt, tokens);
    int64_t& seen = last_epoch[static_cast<size_t>(o.dataset)];
    if (o.epoch != seen) {
      const TrainData::Source& src = data->source(o.dataset);
      if (seen >= 0 && o.epoch > seen)
        Log("data: {} exhausted after {} epoch(s) of {} samples; epoch {} begins with a new "
            "deterministic order (run sample {})",
            src.name, o.epoch, src.train->SamplesPerEpoch(), o.epoch + 1, index);
      else if (o.epoch > 0)
        Log("data: {} is in epoch {} (run sample {})", src.name, o.epoch + 1, index);
      seen = o.epoch;
    }
    return o.dataset;
  };
  SampleFn valid_fn;
  std::vector<ValidationSet> valid_sets;
  if (!mixture && data->source(0).valid) {
    valid_fn = [&](int64_t index, int32_t* tokens) {
      data->GetValidSample(0, index, tokens);
      return 0;
    };
  } else if (mixture) {
    for (int d = 0; d < data->NumDatasets(); ++d) {
      if (!data->source(d).valid) continue;
      valid_sets.push_back({data->source(d).name, data->source(d).weight,
                            [&data, d](int64_t index, int32_t* tokens) {
                              data->GetValidSample(d, index, tokens);
                              return d;
                            }});
    }
  }

  Trainer trainer(cfg, backend.get(), comm.get(), env, train_fn, valid_fn);
  trainer_ptr = &trainer;
  if (mixture) {
    trainer.set_dataset_names(data->Names());
    trainer.set_validation_sets(valid_sets);
  }
  {
    // Iteration ranges are journaled below; here the iterations the sample ranges stand for.
    std::vector<std::pair<int64_t, int64_t>> sample_ranges;
    (void)ParseSampleRanges(cfg.skip_train_samples_range, &sample_ranges);  // validated above
    for (auto [a, b] : sample_ranges) {
      const IterationRange r = trainer.IterationsReading(a, b);
      if (r.first > 0)
        Log("data: iterations {}..{} will be skipped (--skip-train-samples-range {}-{})", r.first,
            r.last, a, b);
      else
        Warn("--skip-train-samples-range {}-{} lies past the end of this run: nothing to skip", a,
             b);
    }
  }
  if (!nan_grad.empty())
    trainer.set_gradient_fault([&](int64_t it, float* g, size_t) {
      for (auto [a, b] : nan_grad) {
        if (it >= a && it <= b) {
          const float nan = NAN;
          backend->CopyToDevice(g, &nan, 1);
        }
      }
    });
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
  if (saved) {
    const auto l0 = std::chrono::steady_clock::now();
    st = RestoreTrainCheckpoint(env, *saved, trainer);
    if (!st.ok()) return Fail(st);
    const double ls = std::chrono::duration<double>(std::chrono::steady_clock::now() - l0).count();
    Log("resumed from {}: iteration {}, consumed samples {}, optimizer step {}, next LR {:.6E}, "
        "LR scale {} (loaded in {:.2f} s)",
        saved->dir, saved->counters.iteration, saved->counters.consumed_samples,
        trainer.optimizer().step(), trainer.NextLr(), trainer.lr_scale(), ls);
  } else {
    trainer.InitializeWeights();
    if (!cfg.save.empty()) Log("no checkpoint in {}: starting from fresh weights", cfg.save);
  }
  std::unique_ptr<CheckpointStore> store;
  if (!cfg.save.empty()) {
    store =
        std::make_unique<CheckpointStore>(env, cfg.save, [](const std::string& l) { LogLine(l); });
    InstallStopSignalHandlers();
  }
  RunInfo run_info{prefix, meta, nlohmann::json::array()};
  for (int d = 0; d < data->NumDatasets(); ++d)
    run_info.datasets.push_back({{"name", data->source(d).name},
                                 {"prefix", data->source(d).prefix},
                                 {"shards", data->source(d).shards},
                                 {"weight", data->source(d).weight}});
  CheckpointController ckpt(cfg, env, store.get(), &trainer, run_info, history,
                            [](const std::string& l) { LogLine(l); });
  if (saved && load_dir == cfg.save) ckpt.set_last_saved_iteration(saved->counters.iteration);

  // ---- the run's journal and the guard ----
  RunJournal journal(env, cfg.save, [](const std::string& l) { LogLine(l); });
  journal.Heading(fmt::format("{} at iteration {} ({}, keel {})",
                              saved ? (rollback ? "rolled back" : "resumed") : "started",
                              trainer.counters().iteration, Now(), KEEL_VERSION));
  if (saved)
    journal.Append(history.back(), fmt::format("{} from {} at iteration {}",
                                               rollback ? "rolled back by hand" : "resumed",
                                               saved->dir, saved->counters.iteration));
  // ---- metrics: metrics.jsonl and TensorBoard files, rewound to where this run continues ----
  std::unique_ptr<RunMetrics> metrics;
  st = RunMetrics::Open(env, cfg.save, &metrics);
  if (st.ok()) {
    std::string archived;
    const TrainCounters& c = trainer.counters();
    st = metrics->Rewind({c.iteration, c.consumed_samples, c.consumed_tokens},
                         rollback ? "rollback"
                         : saved  ? "resume"
                                  : "restart",
                         &archived);
    if (st.ok() && !archived.empty())
      Log("metrics: the records after iteration {} were moved to {}; metrics.jsonl and "
          "tensorboard/ continue from iteration {}",
          c.iteration, archived, c.iteration);
  }
  if (!st.ok()) return Fail(st);
  journal.set_observer([&](const nlohmann::json& ev, const std::string& sentence) {
    const bool has_it = ev.contains("iteration") && ev["iteration"].is_number_integer();
    (void)metrics->AppendText(
        has_it ? ev["iteration"].get<int64_t>() : trainer.counters().iteration, "guard/events",
        sentence);
  });
  GuardController guard(cfg, env, store.get(), &trainer, store ? &ckpt : nullptr, &journal,
                        [](const std::string& l) { LogLine(l); });
  st = guard.Start(saved.get());
  if (!st.ok()) return Fail(st);
  ckpt.set_guard_state_fn([&guard] { return guard.StateForCheckpoint(); });
  {
    std::vector<std::pair<int64_t, int64_t>> ranges;
    (void)ParseIterationRanges(cfg.skip_train_iteration_range, &ranges);  // validated above
    for (auto [a, b] : ranges) {
      if (b <= trainer.counters().iteration) continue;
      journal.Append(
          {{"event", "skip_range"},
           {"source", "--skip-train-iteration-range"},
           {"iterations", {a, b}},
           {"iteration", trainer.counters().iteration}},
          fmt::format("iterations {}..{} will be skipped (--skip-train-iteration-range): "
                      "their samples are read past without an update",
                      a, b));
    }
  }
  if (cfg.lr_scale_on_resume > 0 && cfg.lr_scale_on_resume != trainer.lr_scale()) {
    Log("LR scale {} -> {} (--lr-scale-on-resume){}", trainer.lr_scale(), cfg.lr_scale_on_resume,
        saved ? "" : "; no checkpoint to resume, so it applies from the first iteration");
    nlohmann::json ev = {{"event", "lr_scale"},
                         {"iteration", trainer.counters().iteration},
                         {"at", Now()},
                         {"old", trainer.lr_scale()},
                         {"new", cfg.lr_scale_on_resume}};
    ckpt.AddHistory(ev);
    journal.Append(
        ev, fmt::format("iteration {}: LR scale {} -> {} (--lr-scale-on-resume)",
                        trainer.counters().iteration, trainer.lr_scale(), cfg.lr_scale_on_resume));
    trainer.set_lr_scale(cfg.lr_scale_on_resume);
  }

  if (trainer.counters().iteration >= trainer.TotalIterations()) {
    Log("the checkpoint at iteration {} already completes this run of {} iterations; raise "
        "--train-iters (and accept the longer decay with --override-scheduler) to train further",
        trainer.counters().iteration, trainer.TotalIterations());
  } else {
    const auto t0 = std::chrono::steady_clock::now();
    RunHooks hooks;
    hooks.log = [](const std::string& line) { LogLine(line); };
    hooks.after_iteration = [&] { return guard.AfterIteration() && ckpt.AfterIteration(); };
    bool metrics_failed = false;
    hooks.metrics = [&](const nlohmann::json& m) {
      Status ms = metrics->Append(m);
      if (!ms.ok() && !metrics_failed) {  // metrics must never stop training; said once
        Warn("metrics: cannot write to {}: {}; training goes on without them", cfg.save,
             ms.message());
        metrics_failed = true;
      }
    };
    st = trainer.Run(hooks);
    if (!st.ok()) return Fail(st);
    if (guard.stopped()) {
      // The state is not healthy: no final checkpoint of it; the pinned ones remain.
      LogError("error: " + guard.stop_message());
      LogError(fmt::format(
          "the run's chronicle is in {}",
          cfg.save.empty() ? std::string("the log above") : JoinPath(cfg.save, kChronicleFile)));
      Log("state fingerprint: {:016x}", trainer.StateFingerprint());
      return 3;
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    st = ckpt.Finish();
    if (!st.ok()) return Fail(st);
    if (ckpt.stop_reason() != StopReason::kNone) {
      Log("stopped at iteration {} of {} because {}{}", trainer.counters().iteration,
          trainer.TotalIterations(), StopReasonText(ckpt.stop_reason()),
          store ? "; run the same command to resume" : " (no --save: nothing was saved)");
      Log("state fingerprint: {:016x}", trainer.StateFingerprint());
      return 0;
    }
    Log("training finished: iteration {} in {:.1f} s", trainer.counters().iteration, secs);
    const SamplePrefetcher::Stats ps = prefetcher.stats();
    Log("data: {} samples read ahead on a background thread; the loop waited for {} of them "
        "({:.1f} ms in all, {} read-ahead restarts)",
        ps.served, ps.waited, ps.wait_ms, ps.restarts);
  }
  Log("state fingerprint: {:016x}", trainer.StateFingerprint());
  if (store) Log("checkpoints are in {} (sample with `keel sample --load {}`)", cfg.save, cfg.save);
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

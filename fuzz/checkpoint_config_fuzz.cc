// A checkpoint's config.toml, read by ReadSavedTrainState (every resume, `keel sample`, the
// checkpoint tools) beside a valid state.json, then compared with a new run's config by the resume
// rules (DiffConfigForResume, CheckResumeChanges) as `keel train` does.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/resume.h"
#include "checkpoint/train_checkpoint.h"
#include "config/config.h"
#include "fuzz_input.h"
#include "mem_env.h"

namespace {

constexpr char kState[] = R"({"format": "keel-train-state", "format_version": 1,
  "counters": {"iteration": 40, "consumed_samples": 80, "consumed_tokens": 1280,
               "skipped_iterations": 0, "nan_iterations": 0, "data_skipped_iterations": 2},
  "optimizer": {"step": 38}, "scheduler": {"lr_scale": 1.0},
  "data": {"order_salt": 0, "skipped_iteration_ranges": [[12, 13]]}, "metrics": {"interval": 5},
  "guard": null, "history": [],
  "model": {"alibi": false, "embed_layernorm": false, "eod_id": 1, "ffn_hidden": 64, "heads": 2,
            "hidden": 16, "layernorm_eps": 1e-05, "max_positions": 16, "num_layers": 1,
            "padded_vocab": 512, "qk_layernorm": false, "reset_attention_mask": false,
            "reset_position_ids": false, "vocab": 400, "z_loss": 0.0}})";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  keel::fuzz::MemEnv env;
  env.Put("/run/iter_0000040/state.json", kState);
  env.Put("/run/iter_0000040/config.toml", keel::fuzz::AsString(data, size));
  keel::SavedTrainState saved;
  if (!keel::ReadSavedTrainState(&env, "/run/iter_0000040", &saved).ok()) return 0;
  // ReadSavedTrainState validates the saved config, so what it accepts is safe to diff.
  std::vector<std::string> notes;
  keel::TrainConfig now;
  if (!keel::Validate(&now, &notes).ok()) return 0;
  const auto changes = keel::DiffConfigForResume(saved.config, now);
  std::vector<keel::ConfigChange> accepted, free;
  (void)keel::CheckResumeChanges(changes, now, &accepted, &free);
  return 0;
}

// Deliberate, recorded changes to a saved checkpoint (`keel ckpt edit`, docs/checkpoint-tools.md).
//
// An edit scales the LR of the resumed run (state.json scheduler.lr_scale and next_lr) and/or
// changes scheduler and optimizer keys of the checkpoint's config.toml. Every edit is appended to
// state.json "history" as {"event":"edit","at":UTC,"changes":[{key,old,new}],"reason":...} and
// config_hash is recomputed. The checkpoint is rewritten atomically (RewriteCheckpointFiles):
// readers, and a crash at any point, see the old or the edited checkpoint, never a mix.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/env.h"
#include "core/status.h"

namespace keel {

struct CheckpointEditRequest {
  std::optional<double> scale_lr;  // multiplies scheduler.lr_scale (and next_lr); > 0
  std::vector<std::string> sets;   // "KEY=VALUE" for the config keys IsEditableConfigKey accepts
  std::string reason;              // required; recorded in the history
  std::string at;                  // UTC time recorded in the history; empty: now
};

struct CheckpointEditChange {
  std::string key;  // "scheduler.lr_scale" or "config.KEY"
  nlohmann::json old_value, new_value;
};

// The config keys an edit may change: lr, min-lr, lr-decay-style, lr-warmup-samples/-iters,
// lr-decay-samples/-iters, adam-beta1, adam-beta2, adam-eps, weight-decay, clip-grad.
bool IsEditableConfigKey(const std::string& key);

// Edits the checkpoint directory `dir` (an iter_N directory). Usage errors (no change, no reason,
// a refused key, an invalid value) are InvalidArgument and leave the checkpoint untouched; a
// checkpoint that does not verify (files, sizes, checksums, state.json) is refused. `changes`
// (optional) receives what was changed.
Status EditCheckpoint(Env* env, const std::string& dir, const CheckpointEditRequest& request,
                      std::vector<CheckpointEditChange>* changes);

}  // namespace keel

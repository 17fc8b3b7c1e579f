#include "checkpoint/checkpoint_edit.h"

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <set>

#include "checkpoint/checkpoint_rewrite.h"
#include "checkpoint/manifest.h"
#include "checkpoint/resume.h"
#include "checkpoint/train_checkpoint.h"
#include "config/config.h"
#include "core/timestamp.h"
#include "journal/events.h"

namespace keel {
namespace {

using ojson = nlohmann::ordered_json;

const std::set<std::string>& EditableKeys() {
  static const std::set<std::string> keys = {"lr",
                                             "min-lr",
                                             "lr-decay-style",
                                             "lr-warmup-samples",
                                             "lr-warmup-iters",
                                             "lr-decay-samples",
                                             "lr-decay-iters",
                                             "adam-beta1",
                                             "adam-beta2",
                                             "adam-eps",
                                             "weight-decay",
                                             "clip-grad"};
  return keys;
}

// Why a config key other than the editable ones is refused.
std::string RefusalReason(const std::string& key) {
  const ConfigChange::Kind kind = ResumeKindOfKey(key);
  if (kind == ConfigChange::Kind::kShape)
    return "it is part of the model shape, which is fixed by the saved weights and can never be "
           "edited";
  if (kind == ConfigChange::Kind::kDataOrder)
    return "it changes the data order; give the new value when resuming, with "
           "--override-data-order";
  return "only scheduler and optimizer settings can be edited (lr, min-lr, lr-decay-style, "
         "lr-warmup-samples/-iters, lr-decay-samples/-iters, adam-beta1, adam-beta2, adam-eps, "
         "weight-decay, clip-grad); give other settings on the resume command line";
}

// The TOML literal for `value` of `key`: as given when it parses (numbers), else quoted (strings
// such as lr-decay-style=cosine). Checked by applying it alone to a default config.
Status TomlLiteral(const std::string& key, const std::string& value, std::string* literal) {
  TrainConfig scratch;
  Status st = ApplyToml(key + " = " + value + "\n", "--set " + key, &scratch);
  if (st.ok()) {
    *literal = value;
    return st;
  }
  if (value.empty() || value.front() != '"') {
    const std::string quoted = "\"" + value + "\"";
    TrainConfig scratch2;
    if (value.find_first_of("\"\\\n") == std::string::npos &&
        ApplyToml(key + " = " + quoted + "\n", "--set " + key, &scratch2).ok()) {
      *literal = quoted;
      return Status::OK();
    }
  }
  return Status::InvalidArgument(st.message());
}

}  // namespace

bool IsEditableConfigKey(const std::string& key) {
  return EditableKeys().count(key) > 0;
}

Status EditCheckpoint(Env* env, const std::string& dir, const CheckpointEditRequest& request,
                      std::vector<CheckpointEditChange>* changes_out) {
  // Usage first: nothing is read before the request is known to be well formed.
  if (!request.scale_lr && request.sets.empty())
    return Status::InvalidArgument("nothing to edit: give --scale-lr S and/or --set KEY=VALUE");
  if (request.reason.empty())
    return Status::InvalidArgument(
        "--reason TEXT is required: the edit is recorded in the checkpoint's history");
  if (request.scale_lr && (!(*request.scale_lr > 0) || !std::isfinite(*request.scale_lr)))
    return Status::InvalidArgument(
        fmt::format("--scale-lr {} must be a positive finite factor", *request.scale_lr));
  std::vector<std::pair<std::string, std::string>> sets;
  for (const std::string& kv : request.sets) {
    const auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      return Status::InvalidArgument("--set " + kv + ": expected KEY=VALUE, e.g. lr=1e-4");
    const std::string key = kv.substr(0, eq);
    if (!IsEditableConfigKey(key))
      return Status::InvalidArgument("--set " + key + " is refused: " + RefusalReason(key));
    std::string literal;
    KEEL_RETURN_IF_ERROR(TomlLiteral(key, kv.substr(eq + 1), &literal));
    sets.emplace_back(key, literal);
  }

  // Only a checkpoint that verifies is edited: the edit re-checksums its files.
  Status v = VerifyCheckpointDir(env, dir, /*check_contents=*/true, nullptr);
  if (!v.ok())
    return Status::Corruption("refusing to edit a checkpoint that fails verification: " +
                              v.message());
  SavedTrainState saved;
  v = ReadSavedTrainState(env, dir, &saved);
  if (!v.ok()) return Status::Corruption("refusing to edit: " + v.message());

  std::string state_text;
  KEEL_RETURN_IF_ERROR(env->ReadFileToString(JoinPath(dir, "state.json"), &state_text));
  ojson s = ojson::parse(state_text, nullptr, false);
  if (s.is_discarded()) return Status::Corruption(JoinPath(dir, "state.json") + " is not JSON");
  std::string config_text = saved.config_text;
  std::vector<CheckpointEditChange> changes;

  if (request.scale_lr) {
    const double factor = *request.scale_lr;
    const double old_scale = saved.train.lr_scale;
    s["scheduler"]["lr_scale"] = old_scale * factor;
    if (s["scheduler"].contains("next_lr") && s["scheduler"]["next_lr"].is_number())
      s["scheduler"]["next_lr"] = s["scheduler"]["next_lr"].get<double>() * factor;
    changes.push_back({"scheduler.lr_scale", old_scale, old_scale * factor});
  }
  for (const auto& [key, literal] : sets) {
    // config.toml is FormatConfig output: one "key = literal" line per setting.
    const std::string prefix = key + " = ";
    const size_t nl = config_text.find("\n" + prefix);
    const size_t at = nl != std::string::npos             ? nl + 1
                      : config_text.rfind(prefix, 0) == 0 ? 0
                                                          : std::string::npos;
    if (at == std::string::npos)
      return Status::Corruption(JoinPath(dir, "config.toml") + " has no '" + key + "' line");
    const size_t value_at = at + prefix.size();
    size_t line_end = config_text.find('\n', value_at);
    if (line_end == std::string::npos) line_end = config_text.size();
    const std::string old_literal = config_text.substr(value_at, line_end - value_at);
    config_text.replace(value_at, line_end - value_at, literal);
    changes.push_back({"config." + key, old_literal, literal});
  }
  double lr = saved.config.lr;  // of the resumed run
  if (!sets.empty()) {
    // The edited config must load and pass every rule, as it will on resume.
    TrainConfig cfg;
    Status st = ApplyToml(config_text, JoinPath(dir, "config.toml") + " (edited)", &cfg);
    std::vector<std::string> notes;
    if (st.ok()) {
      cfg.model.vocab = saved.spec.vocab;
      st = Validate(&cfg, &notes);
    }
    if (!st.ok()) return Status::InvalidArgument("the edit is invalid: " + st.message());
    s["config_hash"] = HexDigest(ConfigHash(cfg));
    lr = cfg.lr;
  }
  if (request.scale_lr && !(lr * saved.train.lr_scale * *request.scale_lr <= kMaxLearningRate))
    return Status::InvalidArgument(fmt::format(
        "--scale-lr {} would make the resumed run's learning rate {:g} (lr {:g} x LR scale {:g} "
        "x {}), above {}, the largest keel trains at; use a smaller factor",
        *request.scale_lr, lr * saved.train.lr_scale * *request.scale_lr, lr, saved.train.lr_scale,
        *request.scale_lr, kMaxLearningRate));

  EditEvent edit;
  edit.at = request.at.empty() ? UtcTimestamp() : request.at;
  for (const CheckpointEditChange& c : changes)
    edit.changes.push_back({c.key, c.old_value, c.new_value});
  edit.reason = request.reason;
  if (!s.contains("history") || !s["history"].is_array()) s["history"] = ojson::array();
  s["history"].push_back(edit.ToJson());
  std::map<std::string, std::string> replaced = {{"state.json", s.dump(2) + "\n"}};
  if (!sets.empty()) replaced["config.toml"] = config_text;
  KEEL_RETURN_IF_ERROR(RewriteCheckpointFiles(env, dir, replaced));
  if (changes_out) *changes_out = std::move(changes);
  return Status::OK();
}

}  // namespace keel

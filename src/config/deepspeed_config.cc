#include "config/deepspeed_config.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "config/config.h"
#include "config/config_internal.h"
#include "core/env.h"
#include "core/json_reader.h"

namespace keel {
namespace {

using json = nlohmann::json;

// Keys keel reads nothing from, and why that changes nothing in a keel run.
const std::map<std::string, std::string>& IgnoredKeys() {
  static const std::map<std::string, std::string> kKeys = {
      {"steps_per_print", "keel prints the iteration line every --log-interval"},
      {"wall_clock_breakdown",
       "keel's phase times are in TensorBoard with --log-timers-to-tensorboard"},
      {"dump_state", "keel prints its resolved config at start"},
      {"memory_breakdown", "keel prints its memory estimate at start"},
      {"zero_allow_untested_optimizer", "keel's optimizer is its own AdamW"},
      {"prescale_gradients", "keel sums gradients in fp32 and averages them once"},
      {"gradient_predivide_factor", "keel sums gradients in fp32 and averages them once"},
      {"communication_data_type", "keel reduces gradients in fp32"},
      {"fp32_allreduce", "keel reduces gradients in fp32"},
      {"sparse_gradients", "keel's embedding gradients are dense"},
      {"tensorboard", "keel's TensorBoard files: --tensorboard-dir"},
      {"wandb", "keel writes TensorBoard files and metrics.jsonl"},
      {"csv_monitor", "keel writes metrics.jsonl"},
      {"comms_logger", "keel logs its data-parallel traffic at the end of a run"},
      {"flops_profiler", "keel reports TFLOPs in the iteration line; keel bench --profile"},
      {"activation_checkpointing",
       "how DeepSpeed partitions or offloads the recomputation's checkpoints across "
       "model-parallel ranks; keel recomputes with --checkpoint-activations "
       "(--recompute-granularity full) and keeps each layer's input in host memory"},
  };
  return kKeys;
}

class Reader {
 public:
  Reader(const std::string& origin, DeepSpeedConfig* out) : origin_(origin), out_(out) {}

  Status Fail(const std::string& key, const std::string& what) {
    return Status::InvalidArgument(fmt::format("DeepSpeed config {}: {} {}", origin_, key, what));
  }

  // A positive integer (DeepSpeed's "auto" is the Hugging Face Trainer's to fill in).
  Status PositiveInt(const json& v, const std::string& key, std::optional<int64_t>* out) {
    if (v.is_string() && v.get<std::string>() == "auto")
      return Fail(key,
                  "is \"auto\", which the Hugging Face Trainer fills in before DeepSpeed "
                  "reads the file; give the number");
    if (!v.is_number_integer() || v.get<int64_t>() < 1 ||
        v.get<int64_t>() > std::numeric_limits<int32_t>::max())
      return Fail(key, fmt::format("must be a positive integer, but is {}", DescribeJson(v)));
    *out = v.get<int64_t>();
    return Status::OK();
  }

  Status Number(const json& v, const std::string& key, double min, double* out) {
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < min)
      return Fail(key,
                  fmt::format("must be a number of at least {}, but is {}", min, DescribeJson(v)));
    *out = v.get<double>();
    return Status::OK();
  }

  Status Bool(const json& v, const std::string& key, std::optional<bool>* out) {
    if (!v.is_boolean()) return Fail(key, "must be true or false, but is " + DescribeJson(v));
    *out = v.get<bool>();
    return Status::OK();
  }

  Status Precision(const json& section, const std::string& name, std::optional<bool>* enabled) {
    if (!section.is_object())
      return Fail(name, "must be an object, but is " + DescribeJson(section));
    for (auto it = section.begin(); it != section.end(); ++it) {
      const std::string key = name + "." + it.key();
      const json& v = it.value();
      if (it.key() == "enabled") {
        if (v.is_string() && v.get<std::string>() == "auto")
          return Fail(key, "is \"auto\"; give true or false");
        KEEL_RETURN_IF_ERROR(Bool(v, key, enabled));
      } else if (name != "fp16") {
        out_->ignored.push_back(key + " (keel's bf16 keeps fp32 master weights and gradients)");
      } else if (it.key() == "loss_scale") {
        KEEL_RETURN_IF_ERROR(Number(v, key, 0, &out_->loss_scale));
      } else if (it.key() == "initial_scale_power") {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 64)
          return Fail(key, "must be an integer from 0 to 64, but is " + DescribeJson(v));
        out_->initial_scale_power = v.get<int>();
      } else if (it.key() == "loss_scale_window") {
        std::optional<int64_t> w;
        KEEL_RETURN_IF_ERROR(PositiveInt(v, key, &w));
        out_->loss_scale_window = *w;
      } else if (it.key() == "hysteresis") {
        std::optional<int64_t> h;
        KEEL_RETURN_IF_ERROR(PositiveInt(v, key, &h));
        out_->hysteresis = *h;
      } else if (it.key() == "min_loss_scale") {
        KEEL_RETURN_IF_ERROR(Number(v, key, 0, &out_->min_loss_scale));
        if (out_->min_loss_scale <= 0) return Fail(key, "must be positive");
      } else if (it.key() == "consecutive_hysteresis") {
        std::optional<bool> c;
        KEEL_RETURN_IF_ERROR(Bool(v, key, &c));
        if (*c)
          return Fail(key,
                      "is true, which keel's loss scaler does not implement (it follows "
                      "Megatron's and DeepSpeed's default hysteresis); set it to false");
      } else if (it.key() == "auto_cast") {
        out_->ignored.push_back(key + " (keel casts to fp16 inside its own kernels)");
      } else {
        out_->ignored.push_back(key + " (not known to keel)");
      }
    }
    return Status::OK();
  }

  Status Zero(const json& z) {
    if (!z.is_object())
      return Fail("zero_optimization", "must be an object, but is " + DescribeJson(z));
    for (auto it = z.begin(); it != z.end(); ++it) {
      const std::string key = "zero_optimization." + it.key();
      if (it.key() == "stage") {
        if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
            it.value().get<int64_t>() > 3)
          return Fail(key, "must be 0, 1, 2 or 3, but is " + DescribeJson(it.value()));
        out_->zero_stage = it.value().get<int>();
      } else if (it.key().rfind("offload", 0) == 0) {
        out_->ignored.push_back(key + " (keel's optimizer states are in host memory already)");
      } else {
        out_->ignored.push_back(
            key + " (keel's buckets and overlap: --ddp-bucket-size, --overlap-grad-reduce)");
      }
    }
    return Status::OK();
  }

  Status Read(const json& doc) {
    if (!doc.is_object())
      return Status::InvalidArgument(fmt::format(
          "DeepSpeed config {} is not a JSON object (the file --deepspeed_config names)", origin_));
    for (auto it = doc.begin(); it != doc.end(); ++it) {
      const std::string& key = it.key();
      const json& v = it.value();
      if (key == "train_batch_size") {
        KEEL_RETURN_IF_ERROR(PositiveInt(v, key, &out_->train_batch_size));
      } else if (key == "train_micro_batch_size_per_gpu") {
        KEEL_RETURN_IF_ERROR(PositiveInt(v, key, &out_->micro_batch_size));
      } else if (key == "gradient_accumulation_steps") {
        KEEL_RETURN_IF_ERROR(PositiveInt(v, key, &out_->gradient_accumulation_steps));
      } else if (key == "gradient_clipping") {
        double c = 0;
        KEEL_RETURN_IF_ERROR(Number(v, key, 0, &c));
        out_->gradient_clipping = c;
      } else if (key == "zero_optimization") {
        KEEL_RETURN_IF_ERROR(Zero(v));
      } else if (key == "fp16") {
        out_->fp16_section = true;
        KEEL_RETURN_IF_ERROR(Precision(v, key, &out_->fp16));
      } else if (key == "bf16" || key == "bfloat16") {  // bfloat16: DeepSpeed's older name
        KEEL_RETURN_IF_ERROR(Precision(v, key, &out_->bf16));
      } else if (key == "optimizer" || key == "scheduler") {
        return Fail(key,
                    fmt::format("is given: under DeepSpeed it replaces the {} Megatron's flags "
                                "describe, and keel takes the {} from the flags (--lr, --min-lr, "
                                "--adam-beta1, --adam-beta2, --adam-eps, --weight-decay, "
                                "--lr-decay-style, --lr-warmup-*): move its values to the flags "
                                "and remove the section",
                                key == "optimizer" ? "optimizer" : "learning-rate schedule",
                                key == "optimizer" ? "optimizer" : "schedule"));
      } else if (key == "amp") {
        std::optional<bool> on;
        if (v.is_object() && v.contains("enabled"))
          KEEL_RETURN_IF_ERROR(Bool(v["enabled"], "amp.enabled", &on));
        if (on.value_or(false))
          return Fail("amp.enabled",
                      "is true: NVIDIA Apex AMP is not in keel; use \"bf16\" or "
                      "\"fp16\" {\"enabled\": true}");
        out_->ignored.push_back("amp (disabled)");
      } else {
        auto known = IgnoredKeys().find(key);
        out_->ignored.push_back(
            key + " (" +
            (known != IgnoredKeys().end() ? known->second : std::string("not known to keel")) +
            ")");
      }
    }
    return Status::OK();
  }

 private:
  std::string origin_;
  DeepSpeedConfig* out_;
};

}  // namespace

Status ParseDeepSpeedConfig(const std::string& text, const std::string& origin,
                            DeepSpeedConfig* out) {
  *out = DeepSpeedConfig();
  if (text.size() > kMaxDeepSpeedConfigBytes)  // what the read refuses, for text from elsewhere
    return FileTooLarge(origin, kMaxDeepSpeedConfigBytes);
  const json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded())
    return Status::InvalidArgument(fmt::format(
        "DeepSpeed config {} is not valid JSON (the file --deepspeed_config names)", origin));
  Reader r(origin, out);
  return r.Read(doc);
}

namespace config_internal {

namespace {

std::string Num(double v) {
  return fmt::format("{}", v);
}

}  // namespace

Status ApplyDeepSpeedConfig(const std::set<std::string>& given, int* zero_stage, TrainConfig* cfg,
                            std::vector<std::string>* notes) {
  if (cfg->deepspeed_config.empty()) {
    if (cfg->deepspeed)
      return Status::InvalidArgument(
          "--deepspeed needs --deepspeed_config FILE, the DeepSpeed config JSON (DeepSpeed "
          "refuses to start without one too)");
    return Status::OK();
  }
  const std::string& path = cfg->deepspeed_config;
  if (!cfg->deepspeed) {
    notes->push_back("--deepspeed_config " + path +
                     " is not read without --deepspeed, as in Megatron-DeepSpeed");
    return Status::OK();
  }
  std::string text;
  Status rs = Env::Default()->ReadFileToString(path, &text, kMaxDeepSpeedConfigBytes);
  if (!rs.ok())
    return Status::InvalidArgument(
        fmt::format("--deepspeed_config {}: cannot read the file ({})", path, rs.message()));
  DeepSpeedConfig ds;
  KEEL_RETURN_IF_ERROR(ParseDeepSpeedConfig(text, path, &ds));
  std::vector<std::string> applied, unused;
  const std::string where = "DeepSpeed config " + path;
  // Settings both sides must agree on: Megatron's data loader reads the flags, DeepSpeed's
  // engine the file; a difference is a script error either would trip over.
  auto agree = [&](const char* key, const char* flag, int64_t value, int* field) -> Status {
    if (given.count(flag) && *field != value)
      return Status::InvalidArgument(fmt::format(
          "{}: {} is {} but --{} is {}: Megatron-DeepSpeed's data loader reads the flag and "
          "DeepSpeed's engine the file, so they must agree; make them equal",
          where, key, value, flag, *field));
    *field = static_cast<int>(value);
    applied.push_back(fmt::format("--{} {} ({})", flag, value, key));
    return Status::OK();
  };
  if (ds.micro_batch_size)
    KEEL_RETURN_IF_ERROR(agree("train_micro_batch_size_per_gpu", "micro-batch-size",
                               *ds.micro_batch_size, &cfg->micro_batch_size));
  if (ds.train_batch_size)
    KEEL_RETURN_IF_ERROR(agree("train_batch_size", "global-batch-size", *ds.train_batch_size,
                               &cfg->global_batch_size));
  if (ds.gradient_accumulation_steps) {
    cfg->gradient_accumulation_steps = static_cast<int>(*ds.gradient_accumulation_steps);
    applied.push_back(
        fmt::format("gradient_accumulation_steps {} (the global batch must be "
                    "micro-batch x data-parallel size x it)",
                    *ds.gradient_accumulation_steps));
  }
  if (ds.zero_stage) {
    if (*zero_stage >= 0 && *zero_stage != *ds.zero_stage)
      return Status::InvalidArgument(
          fmt::format("{}: zero_optimization.stage is {} but --zero-stage is {}: make them equal",
                      where, *ds.zero_stage, *zero_stage));
    *zero_stage = *ds.zero_stage;
  }
  // Precision: the flags make the model's dtype and the file DeepSpeed's; they must agree.
  if (ds.fp16.value_or(false) && ds.bf16.value_or(false))
    return Status::InvalidArgument(where + ": fp16 and bf16 are both enabled; enable one");
  for (auto [name, on, flag, field] :
       {std::tuple{"fp16", ds.fp16, "fp16", &cfg->fp16}, {"bf16", ds.bf16, "bf16", &cfg->bf16}}) {
    if (!on) continue;
    if (given.count(flag) && *field != *on)
      return Status::InvalidArgument(
          fmt::format("{}: {}.enabled is {} but --{} is {}: make them agree", where, name,
                      *on ? "true" : "false", flag, *field ? "given" : "false"));
    if (*on && !*field) applied.push_back(fmt::format("--{} ({}.enabled)", flag, name));
    *field = *on;
  }
  // DeepSpeed's engine clips and scales the loss: the file's values are the run's, and the
  // flags for them go unused (Megatron-DeepSpeed hands DeepSpeed an optimizer without its own
  // clipping and loss scaler).
  if (ds.gradient_clipping) {
    if (given.count("clip-grad") && cfg->clip_grad != *ds.gradient_clipping)
      unused.push_back(fmt::format("--clip-grad {}", Num(cfg->clip_grad)));
    cfg->clip_grad = *ds.gradient_clipping;
    applied.push_back(fmt::format("--clip-grad {} (gradient_clipping)", Num(cfg->clip_grad)));
  }
  if (ds.fp16_section) {
    const double initial = std::ldexp(1.0, ds.initial_scale_power);
    for (auto [flag, field, value] :
         {std::tuple{"loss-scale", &cfg->loss_scale, ds.loss_scale},
          {"initial-loss-scale", &cfg->initial_loss_scale, initial},
          {"min-loss-scale", &cfg->min_loss_scale, ds.min_loss_scale}}) {
      if (given.count(flag) && *field != value)
        unused.push_back(fmt::format("--{} {}", flag, Num(*field)));
      *field = value;
    }
    for (auto [flag, field, value] :
         {std::tuple{"loss-scale-window", &cfg->loss_scale_window, ds.loss_scale_window},
          {"hysteresis", &cfg->hysteresis, ds.hysteresis}}) {
      if (given.count(flag) && *field != value)
        unused.push_back(fmt::format("--{} {}", flag, *field));
      *field = value;
    }
    applied.push_back(
        ds.loss_scale > 0
            ? fmt::format("a static loss scale of {} (fp16.loss_scale)", Num(ds.loss_scale))
            : fmt::format("dynamic loss scaling from 2^{} = {} (fp16.initial_scale_power), "
                          "window {}, hysteresis {}, minimum {}",
                          ds.initial_scale_power, Num(initial), ds.loss_scale_window, ds.hysteresis,
                          Num(ds.min_loss_scale)));
  }
  std::string a;
  for (const std::string& s : applied) a += (a.empty() ? "" : ", ") + s;
  notes->push_back(fmt::format("{}: applied {}", where, a.empty() ? "nothing" : a));
  if (!unused.empty()) {
    std::string u;
    for (const std::string& s : unused) u += (u.empty() ? "" : ", ") + s;
    notes->push_back(
        fmt::format("{} unused: under --deepspeed the DeepSpeed config's values apply, as in "
                    "Megatron-DeepSpeed, whose DeepSpeed engine clips and scales the loss itself",
                    u));
  }
  if (!ds.ignored.empty()) {
    std::string i;
    for (const std::string& s : ds.ignored) i += (i.empty() ? "" : ", ") + s;
    notes->push_back(fmt::format("{}: not applied: {}", where, i));
  }
  return Status::OK();
}

}  // namespace config_internal
}  // namespace keel

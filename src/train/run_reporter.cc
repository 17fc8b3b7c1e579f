#include "train/run_reporter.h"

#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/json_number.h"
#include "core/log.h"
#include "core/timestamp.h"
#include "journal/events.h"
#include "train/iteration_log.h"

namespace keel {

RunReporter::RunReporter(const TrainConfig& cfg, const TrainerData& data, int64_t total_iters,
                         RunMetrics* metrics, RunJournal* journal)
    : cfg_(cfg),
      dataset_names_(data.dataset_names),
      report_each_set_(data.report_each_set),
      combine_validation_(data.combine_validation),
      total_iters_(total_iters),
      metrics_(metrics),
      journal_(journal) {
  for (const ValidationSet& v : data.valid_sets) valid_names_.push_back(v.name);
}

void RunReporter::Append(const nlohmann::json& record) {
  if (metrics_ == nullptr) return;
  const Status st = metrics_->Append(record);
  if (st.ok() || metrics_failed_) return;
  // Named by where they go: with --tensorboard-dir and no --save, cfg_.save is empty.
  const std::string& tb = metrics_->tensorboard_dir();
  const std::string where =
      !cfg_.save.empty() && !tb.empty() && tb != JoinPath(cfg_.save, kTensorBoardDir)
          ? fmt::format("{} and {}", cfg_.save, tb)
      : !cfg_.save.empty() ? cfg_.save
                           : tb;
  Warn("metrics: cannot write to {}: {}; training goes on without them", where, st.message());
  metrics_failed_ = true;
}

void RunReporter::Iteration(const StepResult& r) {
  const size_t nd = dataset_names_.size();
  // A loss scale driven down to its floor is how an fp16 run's trouble shows (tr8-104B).
  if (journal_ && r.loss_scale_change == LossScaleChange::kBackedOff &&
      r.loss_scale <= cfg_.min_loss_scale) {
    LossScaleCollapseEvent ev;
    ev.iteration = r.iteration;
    ev.at = UtcTimestamp();
    ev.loss_scale = r.loss_scale;
    journal_->Append(ev,
                     fmt::format("iteration {}: WARNING: the fp16 loss scale fell to its minimum "
                                 "{:g} (--min-loss-scale): gradients overflow even unscaled; the "
                                 "run is likely diverging",
                                 r.iteration, r.loss_scale),
                     "guard: ");
  }
  if (const std::optional<SkippedWindow>& w = r.window_begins)
    LogLine(fmt::format(
        "skipping iterations {}..{}: their {} samples are read past without an "
        "update (samples {}..{})",
        w->first, w->last, w->end_sample - w->first_sample, w->first_sample, w->end_sample - 1));
  else if (r.nan)
    LogLine(fmt::format(
        "WARNING: iteration {}: non-finite {} (loss {}, grad norm {}): update "
        "skipped",
        r.iteration, std::isfinite(r.loss) ? "gradients" : "loss", r.loss, r.grad_norm));
  const double secs = r.step_ms / 1000.0;
  nlohmann::json m = {
      {"kind", "train"},
      {"iteration", r.iteration},
      {"train_iters", total_iters_},
      {"consumed_samples", r.consumed_samples},
      {"consumed_tokens", r.consumed_tokens},
      {"iteration_ms", r.step_ms},
      {"learning_rate", r.lr},
      {"global_batch_size", r.global_batch},
      {"lm_loss", JsonNumber(r.loss)},
      {"loss_scale", r.loss_scale},
      {"grad_norm", JsonNumber(r.grad_norm)},
      {"num_zeros", r.num_zeros},
      {"skipped", r.skipped},
      {"data_skipped", r.data_skipped},
      {"nan", r.nan},
      {"samples_per_second", r.data_skipped ? JsonNumber(NAN) : JsonNumber(r.global_batch / secs)},
      {"tflops", r.data_skipped ? JsonNumber(NAN) : JsonNumber(r.flops / secs / 1e12)}};
  if (!r.timers_ms.empty()) {
    nlohmann::json t = nlohmann::json::object();
    for (const auto& [name, ms] : r.timers_ms) t[name] = ms;
    m["timers_ms"] = t;
  }
  if (nd > 1 && !r.data_skipped) {
    nlohmann::json per = nlohmann::json::object();
    for (size_t d = 0; d < nd; ++d)
      per[dataset_names_[d]] = {{"lm_loss", JsonNumber(r.dataset_loss[d])},
                                {"sequences", r.dataset_sequences[d]}};
    m["datasets"] = per;
  }
  Append(m);
  if (!r.closed_interval) return;
  const LogIntervalState& iv = *r.closed_interval;
  IterationStats s;
  s.iteration = r.iteration;
  s.train_iters = total_iters_;
  s.consumed_samples = r.consumed_samples;
  s.consumed_tokens = r.consumed_tokens;
  s.elapsed_ms_per_iter = iv.ms / static_cast<double>(iv.iters);
  s.learning_rate = r.lr;
  s.global_batch_size = r.global_batch;
  s.lm_loss = iv.ok > 0 ? iv.loss_sum / static_cast<double>(iv.ok) : NAN;
  s.grad_norm = r.grad_norm;
  s.loss_scale = r.loss_scale;
  s.num_zeros = static_cast<double>(r.num_zeros);
  s.skipped_iterations = iv.skipped;
  s.nan_iterations = iv.nan;
  // Throughput of the iterations that computed; none when the whole interval was skipped data.
  const double isecs = iv.ms / 1000.0;
  s.samples_per_second = iv.samples > 0 ? static_cast<double>(iv.samples) / isecs : NAN;
  s.tflops = iv.samples > 0 ? iv.flops / isecs / 1e12 : NAN;
  LogLine(FormatIterationLine(s));
  // A mixture's loss per dataset, over the same interval (the seeds' cm4/pmd curves).
  if (nd > 1) {
    std::string line = " lm loss per dataset |";
    for (size_t d = 0; d < nd; ++d) {
      const int64_t n = d < iv.dataset_sequences.size() ? iv.dataset_sequences[d] : 0;
      line += n > 0 ? fmt::format(" {}: {:.6E} ({} seq) |", dataset_names_[d],
                                  iv.dataset_loss_sum[d] / static_cast<double>(n), n)
                    : fmt::format(" {}: - (0 seq) |", dataset_names_[d]);
    }
    LogLine(line);
  }
  // The guard's signals of this iteration, on a line of their own (the iteration line keeps
  // Megatron's format for the tools that parse it).
  if (cfg_.guard != GuardLevel::kOff && !r.data_skipped)
    LogLine(fmt::format(
        " guard signals | max attention logit: {:.3f} | log Z: {:.3f} | update/weight: {:.3E} "
        "| max Adam v: {:.3E} |",
        r.signals.max_attn_logit, r.signals.log_z, r.signals.update_ratio,
        r.signals.max_exp_avg_sq));
}

void RunReporter::Validation(int64_t iteration, int64_t consumed_samples,
                             const ValidationResult& v) {
  nlohmann::json m = {
      {"kind", "validation"}, {"iteration", iteration}, {"consumed_samples", consumed_samples}};
  if (!report_each_set_) {
    LogLine(FormatValidationLine(iteration, v.loss));
  } else {
    nlohmann::json per = nlohmann::json::object();
    if (combine_validation_) LogLine(FormatValidationLine(iteration, v.loss));
    for (size_t k = 0; k < v.set_loss.size(); ++k) {
      LogLine(FormatValidationLine(iteration, v.set_loss[k], valid_names_[k]));
      per[valid_names_[k]] = {{"lm_loss", JsonNumber(v.set_loss[k])},
                              {"lm_loss_ppl", JsonNumber(LossPpl(v.set_loss[k]))}};
    }
    m["lm_loss"] = JsonNumber(v.loss);
    m["lm_loss_ppl"] = JsonNumber(LossPpl(v.loss));
    m["datasets"] = per;
    Append(m);
    return;
  }
  m["lm_loss"] = JsonNumber(v.loss);
  m["lm_loss_ppl"] = JsonNumber(LossPpl(v.loss));
  Append(m);
}

}  // namespace keel

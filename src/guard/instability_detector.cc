#include "guard/instability_detector.h"

#include <cmath>

#include "core/json_number.h"
#include "core/json_reader.h"

namespace keel {

const char* AnomalyKindName(AnomalyKind k) {
  switch (k) {
    case AnomalyKind::kNone:
      return "none";
    case AnomalyKind::kNonFinite:
      return "non-finite";
    case AnomalyKind::kSpike:
      return "spike";
    case AnomalyKind::kDivergence:
      return "divergence";
  }
  return "?";
}

InstabilityDetector::InstabilityDetector(const DetectorConfig& cfg)
    : cfg_(cfg),
      loss_(static_cast<size_t>(cfg.window)),
      grad_(static_cast<size_t>(cfg.window)),
      recent_(static_cast<size_t>(cfg.divergence_window)) {}

double InstabilityDetector::LossZ(double loss) const {
  return loss_.Z(loss, cfg_.loss_rel_floor, 1e-6);
}

double InstabilityDetector::GradZ(double grad_norm) const {
  return grad_.Z(grad_norm, cfg_.grad_rel_floor, 1e-6);
}

double InstabilityDetector::UpdateRatioZ(double ratio) const {
  if (ratio_.size() < static_cast<size_t>(cfg_.min_history)) return NAN;
  return ratio_.Z(ratio, cfg_.grad_rel_floor, 1e-12);
}

Anomaly InstabilityDetector::Check(const GuardSignals& s) const {
  Anomaly a;
  if (s.nonfinite || !std::isfinite(s.loss) || !std::isfinite(s.grad_norm)) {
    a.kind = AnomalyKind::kNonFinite;
    a.signal = std::isfinite(s.loss) ? "gradients" : "lm loss";
    a.value = std::isfinite(s.loss) ? s.grad_norm : s.loss;
    a.baseline = loss_.RecentMedian(20);
    a.onset = s.iteration;
    return a;
  }
  if (loss_.size() >= static_cast<size_t>(cfg_.min_history)) {
    const double zl = LossZ(s.loss);
    const double zg = GradZ(s.grad_norm);
    if (zl > cfg_.z_threshold || zg > cfg_.grad_z_threshold) {
      const bool by_loss = zl > cfg_.z_threshold;
      a.kind = AnomalyKind::kSpike;
      a.signal = by_loss ? "lm loss" : "grad norm";
      a.value = by_loss ? s.loss : s.grad_norm;
      a.baseline = by_loss ? loss_.RecentMedian(20) : grad_.RecentMedian(20);
      a.z = by_loss ? zl : zg;
      a.onset = s.iteration;
      return a;
    }
  }
  // Divergence: the recent median, including this loss, against the best level.
  if (recent_.size() + 1 >= static_cast<size_t>(cfg_.divergence_window) &&
      std::isfinite(best_level_)) {
    RobustWindow r = recent_;
    r.Add(s.loss);
    const double level = r.Median();
    if (level > best_level_ * (1.0 + cfg_.divergence_rel)) {
      a.kind = AnomalyKind::kDivergence;
      a.signal = "lm loss";
      a.value = level;
      a.baseline = best_level_;
      a.z = LossZ(s.loss);
      a.onset = best_level_iter_;
    }
  }
  return a;
}

void InstabilityDetector::Accept(const GuardSignals& s) {
  // A step with any non-finite value is refused whole: its finite parts are suspect too.
  if (s.nonfinite || !std::isfinite(s.loss) || !std::isfinite(s.grad_norm)) return;
  loss_.Add(s.loss);
  grad_.Add(s.grad_norm);
  ratio_.Add(s.update_ratio);  // NaN (not measured) is refused
  recent_.Add(s.loss);
  if (recent_.size() >= static_cast<size_t>(cfg_.divergence_window)) {
    const double level = recent_.Median();
    if (!std::isfinite(best_level_) || level < best_level_) {
      best_level_ = level;
      best_level_iter_ = s.iteration;
    }
  }
}

void InstabilityDetector::ResetDivergence() {
  recent_.Clear();
  best_level_ = NAN;
  best_level_iter_ = 0;
}

nlohmann::json InstabilityDetector::ToJson() const {
  return {{"loss", loss_.ToJson()},
          {"grad_norm", grad_.ToJson()},
          {"recent_loss", recent_.ToJson()},
          {"update_ratio", ratio_.ToJson()},
          {"best_level", JsonNumber(best_level_)},
          {"best_level_iteration", best_level_iter_}};
}

Status InstabilityDetector::FromJson(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) return Status::Corruption(where + ": detector state is not an object");
  KEEL_RETURN_IF_ERROR(loss_.FromJson(j.value("loss", nlohmann::json()), where + ".loss"));
  KEEL_RETURN_IF_ERROR(
      grad_.FromJson(j.value("grad_norm", nlohmann::json()), where + ".grad_norm"));
  KEEL_RETURN_IF_ERROR(
      recent_.FromJson(j.value("recent_loss", nlohmann::json()), where + ".recent_loss"));
  ratio_.Clear();  // absent in checkpoints saved before keel measured it: starts empty
  if (j.contains("update_ratio"))
    KEEL_RETURN_IF_ERROR(ratio_.FromJson(j["update_ratio"], where + ".update_ratio"));
  JsonReader r(where, j);
  best_level_ = r.root().Optional("best_level").Number();
  best_level_iter_ = r.root().Optional("best_level_iteration").Get<int64_t>(0);
  return r.status();
}

}  // namespace keel

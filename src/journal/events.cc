#include "journal/events.h"

namespace keel {

nlohmann::json ImportEvent::ProvenanceToJson() const {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  journal_internal::FieldWriter w(&j);
  const_cast<ImportEvent*>(this)->ProvenanceFields(w);  // only read through the writer
  return nlohmann::json(j);
}

Status ImportEvent::ProvenanceFromJson(const nlohmann::json& provenance, const std::string& where) {
  JsonReader r(where, provenance);
  journal_internal::FieldReader f(r.root());
  ProvenanceFields(f);
  return r.status();
}

std::vector<EventSchema> RunEventSchemas() {
  std::vector<EventSchema> out;
  auto add = [&](std::vector<EventSchema> s) { out.insert(out.end(), s.begin(), s.end()); };
  add(EventSchemasOf<DetectedEvent>());
  add(EventSchemasOf<SlowDivergenceEvent>());
  add(EventSchemasOf<RecoveredEvent>());
  add(EventSchemasOf<RecoveryConfirmedEvent>());
  add(EventSchemasOf<TransientFaultEvent>());
  add(EventSchemasOf<SkipUpdateEvent>());
  add(EventSchemasOf<WouldActEvent>());
  add(EventSchemasOf<LeadingIndicatorEvent>());
  add(EventSchemasOf<GuardStopEvent>());
  add(EventSchemasOf<RollbackEvent>());
  add(EventSchemasOf<SkipRangeEvent>());
  add(EventSchemasOf<LrScaleEvent>());
  add(EventSchemasOf<LossScaleCollapseEvent>());
  add(EventSchemasOf<HangEvent>());
  add(EventSchemasOf<CollectivesOutOfStepEvent>());
  add(EventSchemasOf<SlowRankEvent>());
  add(EventSchemasOf<JobSlowdownEvent>());
  add(EventSchemasOf<ReplicaMismatchEvent>());
  add(EventSchemasOf<GoodputStartEvent>());
  add(EventSchemasOf<GoodputEvent>());
  add(EventSchemasOf<GoodputSummaryEvent>());
  return out;
}

std::vector<EventSchema> HistoryEventSchemas() {
  std::vector<EventSchema> out;
  auto add = [&](std::vector<EventSchema> s) { out.insert(out.end(), s.begin(), s.end()); };
  add(EventSchemasOf<FinetuneEvent>());
  add(EventSchemasOf<ResumeEvent>());
  add(EventSchemasOf<EditEvent>());
  add(EventSchemasOf<ImportEvent>());
  return out;
}

}  // namespace keel

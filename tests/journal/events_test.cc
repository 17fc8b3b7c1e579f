// The typed kinds of a training run's journal and of a checkpoint's history (journal/events.h):
// each reads back what it writes, refuses a line missing any required field by name, writes the
// very bytes the inline JSON it replaced wrote, and docs/observability.md lists each with its
// fields.
#include "journal/events.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/env.h"
#include "core/json_number.h"
#include "journal/run_journal.h"
#include "journal_test_util.h"

namespace keel {
namespace {

using json = nlohmann::json;

template <class E>
E Filled(const std::string& kind = "") {
  E e;
  if (!kind.empty()) e.SetKind(kind);
  SampleFiller f;
  e.Fields(f);
  return e;
}

json SignalsJson(const EventSignals& s) {  // the guard's SignalsJson before the types
  return {{"lm_loss", JsonNumber(s.lm_loss)},
          {"grad_norm", JsonNumber(s.grad_norm)},
          {"update_ratio", JsonNumber(s.update_ratio)},
          {"max_exp_avg_sq", JsonNumber(s.max_exp_avg_sq)},
          {"max_attn_logit", JsonNumber(s.max_attn_logit)},
          {"log_z", JsonNumber(s.log_z)},
          {"loss_scale", JsonNumber(s.loss_scale)},
          {"nonfinite", s.nonfinite}};
}

// What RunJournal writes for a line: sorted keys, as before the types.
std::string Written(const JournalEvent& e) {
  return json(e.ToJson()).dump();
}

TEST(JournalEventsTest, EveryKindReadsBackAndRefusesAMissingField) {
  CheckEventType<DetectedEvent>();
  CheckEventType<RecoveredEvent>();
  CheckEventType<RecoveryConfirmedEvent>();
  CheckEventType<TransientFaultEvent>();
  CheckEventType<SkipUpdateEvent>();
  CheckEventType<WouldActEvent>();
  CheckEventType<LeadingIndicatorEvent>();
  CheckEventType<GuardStopEvent>();
  CheckEventType<RollbackEvent>();
  CheckEventType<SkipRangeEvent>();
  CheckEventType<LrScaleEvent>();
  CheckEventType<LossScaleCollapseEvent>();
  CheckEventType<HangEvent>();
  CheckEventType<GoodputStartEvent>();
  CheckEventType<GoodputEvent>();
  CheckEventType<GoodputSummaryEvent>();
  CheckEventType<CollectivesOutOfStepEvent>();
  CheckEventType<SlowRankEvent>();
  CheckEventType<JobSlowdownEvent>();
  CheckEventType<ReplicaMismatchEvent>();
  CheckEventType<FinetuneEvent>();
  CheckEventType<ResumeEvent>();
  CheckEventType<EditEvent>();
  CheckEventType<ImportEvent>();
}

TEST(JournalEventsTest, DocsListEveryKind) {
  CheckDocumented("run", RunEventSchemas());
  CheckDocumented("history", HistoryEventSchemas());
}

TEST(JournalEventsTest, AFieldOfTheWrongTypeIsNamed) {
  json line = Filled<RollbackEvent>().ToJson();
  line["skip_iterations"][1] = "ten";
  RollbackEvent e;
  const Status st = RollbackEvent::FromJson(line, "runs/x/events.jsonl line 4", &e);
  EXPECT_EQ(st.message(),
            "runs/x/events.jsonl line 4: key 'skip_iterations[1]' must be an integer, but is the "
            "string \"ten\"");
  line = Filled<DetectedEvent>().ToJson();
  line["signals"].erase("grad_norm");
  DetectedEvent d;
  EXPECT_EQ(DetectedEvent::FromJson(line, "l", &d).message(),
            "l: key 'signals.grad_norm' is missing");
}

TEST(JournalEventsTest, NonFiniteNumbersAndAnAbsentCauseAreNull) {
  DetectedEvent d = Filled<DetectedEvent>();
  d.z = INFINITY;
  d.cause = nullptr;
  const json line = d.ToJson();
  EXPECT_TRUE(line["z"].is_null());
  EXPECT_TRUE(line["cause"].is_null());
  DetectedEvent back;
  ASSERT_TRUE(DetectedEvent::FromJson(line, "l", &back).ok());
  EXPECT_TRUE(std::isnan(back.z));
  EXPECT_TRUE(std::holds_alternative<std::nullptr_t>(back.cause));
}

// The bytes: each kind against the inline JSON its writer built before (copied from there).
TEST(JournalEventsTest, GuardKindsWriteTheBytesOfBefore) {
  {
    const DetectedEvent e = Filled<DetectedEvent>();
    json old = {{"event", "detected"},
                {"iteration", e.iteration},
                {"consumed_samples", e.consumed_samples},
                {"kind", e.kind_name},
                {"signal", e.signal},
                {"value", JsonNumber(e.value)},
                {"baseline", JsonNumber(e.baseline)},
                {"z", JsonNumber(e.z)},
                {"onset", e.onset},
                {"resume_spike", e.resume_spike},
                {"cause", json(std::get<std::string>(e.cause))},
                {"probe_lm_loss", JsonNumber(e.probe_lm_loss)},
                {"signals", SignalsJson(e.signals)}};
    old["mode"] = e.mode;
    EXPECT_EQ(Written(e), old.dump());
  }
  {
    const RecoveredEvent e = Filled<RecoveredEvent>();
    json old = {{"event", "recovered"},
                {"iteration", e.iteration},
                {"onset", e.onset},
                {"classification", e.classification},
                {"skipped_updates", e.skipped_updates},
                {"signals", SignalsJson(e.signals)}};
    old["mode"] = e.mode;
    old["consumed_samples"] = *e.consumed_samples;  // GuardController's
    EXPECT_EQ(Written(e), old.dump());
  }
  {
    RecoveryConfirmedEvent e = Filled<RecoveryConfirmedEvent>();
    e.consumed_samples.reset();  // as the guard emits it
    json old = {{"event", "recovery_confirmed"},
                {"iteration", e.iteration},
                {"signals", SignalsJson(e.signals)}};
    old["mode"] = e.mode;
    EXPECT_EQ(Written(e), old.dump());
  }
  {
    const TransientFaultEvent e = Filled<TransientFaultEvent>();
    const std::vector<int> ranks(e.ranks.begin(), e.ranks.end());
    json old = {{"event", "transient_fault"},
                {"iteration", e.iteration},
                {"lm_loss", JsonNumber(e.lm_loss)},
                {"rerun_lm_loss", JsonNumber(e.rerun_lm_loss)},
                {"transient_faults", e.transient_faults},
                {"ranks", ranks},
                {"signals", SignalsJson(e.signals)}};
    old["mode"] = e.mode;
    old["consumed_samples"] = *e.consumed_samples;
    EXPECT_EQ(Written(e), old.dump());
  }
  {
    SkipUpdateEvent e = Filled<SkipUpdateEvent>();
    e.consumed_samples.reset();
    json old = {{"event", "skip_update"}, {"iteration", e.iteration}, {"onset", e.onset}};
    old["mode"] = e.mode;
    EXPECT_EQ(Written(e), old.dump());
  }
  {
    const WouldActEvent e = Filled<WouldActEvent>();
    json old = {{"event", "would_act"},
                {"iteration", e.iteration},
                {"onset", e.onset},
                {"action", e.action},
                {"reason", e.reason}};
    old["mode"] = e.mode;
    old["consumed_samples"] = *e.consumed_samples;
    EXPECT_EQ(Written(e), old.dump());
  }
  {
    const LeadingIndicatorEvent e = Filled<LeadingIndicatorEvent>();
    json old = {{"event", "leading_indicator"},
                {"iteration", e.iteration},
                {"signal", e.signal},
                {"value", JsonNumber(e.value)},
                {"threshold", JsonNumber(e.threshold)},
                {"action", e.action},
                {"lr_factor", e.lr_factor},
                {"lr_cuts", e.lr_cuts},
                {"next_threshold", JsonNumber(e.next_threshold)},
                {"recommendation", e.recommendation},
                {"signals", SignalsJson(e.signals)}};
    old["mode"] = e.mode;
    old["consumed_samples"] = *e.consumed_samples;
    EXPECT_EQ(Written(e), old.dump());
  }
  {
    const GuardStopEvent e = Filled<GuardStopEvent>();
    json old = {{"event", "stop"}, {"onset", e.onset}, {"reason", e.reason}};
    old["mode"] = e.mode;
    old["consumed_samples"] = *e.consumed_samples;
    EXPECT_EQ(Written(e), old.dump());
  }
}

TEST(JournalEventsTest, TrainAndHealthKindsWriteTheBytesOfBefore) {
  {
    const RollbackEvent e = Filled<RollbackEvent>();
    json old = {{"event", "rollback"},
                {"iteration", e.iteration},
                {"onset", e.onset},
                {"to_iteration", e.to_iteration},
                {"checkpoint", e.checkpoint},
                {"skip_iterations", {e.skip_iterations[0], e.skip_iterations[1]}},
                {"skip_samples", {e.skip_samples[0], e.skip_samples[1]}},
                {"lr_factor", e.lr_factor},
                {"lr_scale", e.lr_scale},
                {"reseed", e.reseed},
                {"data_order_salt", static_cast<uint64_t>(e.data_order_salt)},
                {"level", static_cast<int>(e.level)},
                {"rollbacks", static_cast<int>(e.rollbacks)},
                {"reason", e.reason},
                {"consumed_samples", e.consumed_samples},
                {"kept", e.kept}};
    EXPECT_EQ(Written(e), old.dump());
  }
  {
    const SkipRangeEvent e = Filled<SkipRangeEvent>();
    json old = {{"event", "skip_range"},
                {"source", e.source},
                {"iterations", {e.iterations[0], e.iterations[1]}},
                {"iteration", e.iteration}};
    EXPECT_EQ(Written(e), old.dump());
  }
  {
    const LrScaleEvent e = Filled<LrScaleEvent>();
    json old = {{"event", "lr_scale"},
                {"iteration", e.iteration},
                {"at", e.at},
                {"old", e.old_scale},
                {"new", e.new_scale}};
    EXPECT_EQ(Written(e), old.dump());
  }
  {
    const LossScaleCollapseEvent e = Filled<LossScaleCollapseEvent>();
    json old = {{"event", "loss_scale_collapse"},
                {"iteration", e.iteration},
                {"at", e.at},
                {"loss_scale", e.loss_scale}};
    EXPECT_EQ(Written(e), old.dump());
  }
  {
    const HangEvent e = Filled<HangEvent>();
    json old = {{"event", "hang"},
                {"iteration", e.iteration},
                {"dir", e.dir},
                {"exit_code", static_cast<int>(e.exit_code)},
                // Added for goodput (issue 32): where the hang began.
                {"unix_time", *e.unix_time},
                {"stuck_seconds", *e.stuck_seconds}};
    EXPECT_EQ(Written(e), old.dump());
  }
  {
    const CollectivesOutOfStepEvent e = Filled<CollectivesOutOfStepEvent>();
    json old = {{"event", "collectives_out_of_step"},
                {"iteration", e.iteration},
                {"exit_code", static_cast<int>(e.exit_code)}};
    EXPECT_EQ(Written(e), old.dump());
  }
  for (const char* kind : {"straggler", "straggler_recovered"}) {
    const SlowRankEvent e = Filled<SlowRankEvent>(kind);
    json old = {
        {"event", kind},  {"iteration", e.iteration}, {"rank", static_cast<int>(e.rank)},
        {"host", e.host}, {"slowdown", e.slowdown},   {"since_iteration", e.since_iteration}};
    EXPECT_EQ(Written(e), old.dump());
  }
  for (const char* kind : {"throughput_drop", "throughput_recovered"}) {
    JobSlowdownEvent e = Filled<JobSlowdownEvent>(kind);
    // Levels and the cause are written since every run watches its throughput (issue 37); how
    // sure, since small sustained drops are found against the noise (issue 36).
    json with_levels = {{"baseline", *e.baseline}, {"level", *e.level},
                        {"reason", *e.reason},     {"z", *e.z},
                        {"noise", *e.noise},       {"window", *e.window}};
    const std::string written = Written(e);
    for (const auto& [k, v] : with_levels.items())
      EXPECT_NE(written.find("\"" + k + "\":"), std::string::npos) << k;
    e.baseline.reset();
    e.level.reset();
    e.reason.reset();
    e.z.reset();
    e.noise.reset();
    e.window.reset();
    json old = {{"event", kind},
                {"iteration", e.iteration},
                {"since_iteration", e.since_iteration},
                {"drop", e.drop},
                {"follows_rank", static_cast<int>(e.follows_rank)}};
    old["host"] = *e.host;
    EXPECT_EQ(Written(e), old.dump());
    e.follows_rank = -1;
    e.host.reset();
    old["follows_rank"] = -1;
    old.erase("host");
    EXPECT_EQ(Written(e), old.dump());
  }
  {
    const ReplicaMismatchEvent e = Filled<ReplicaMismatchEvent>();
    json old = {{"event", "replica_mismatch"}, {"iteration", e.iteration}, {"message", e.message}};
    EXPECT_EQ(Written(e), old.dump());
  }
}

TEST(JournalEventsTest, HistoryKindsWriteTheBytesOfBefore) {
  {
    const FinetuneEvent e = Filled<FinetuneEvent>();
    json old = {{"event", "finetune"},
                {"iteration", e.iteration},
                {"at", e.at},
                {"from", e.from},
                {"from_iteration", e.from_iteration},
                {"keel_version", e.keel_version}};
    EXPECT_EQ(Written(e), old.dump());
  }
  for (const char* kind : {"resume", "rollback"}) {
    const ResumeEvent e = Filled<ResumeEvent>(kind);
    json old = {{"event", kind},
                {"iteration", e.iteration},
                {"at", e.at},
                {"from", e.from},
                {"keel_version", e.keel_version}};
    for (const ValueChange& c : *e.accepted_changes)
      old["accepted_changes"].push_back(
          {{"key", c.key}, {"old", c.old_value}, {"new", c.new_value}});
    for (const std::string& c : *e.free_changes) old["free_changes"].push_back(c);
    EXPECT_EQ(Written(e), old.dump());
  }
  {
    // keel ckpt edit appends to an ordered state.json: the order of the keys is kept too.
    const EditEvent e = Filled<EditEvent>();
    using ojson = nlohmann::ordered_json;
    ojson change_list = ojson::array();
    for (const ValueChange& c : e.changes)
      change_list.push_back({{"key", c.key}, {"old", c.old_value}, {"new", c.new_value}});
    ojson old = {{"event", "edit"}, {"at", e.at}, {"changes", change_list}, {"reason", e.reason}};
    EXPECT_EQ(e.ToJson().dump(2), old.dump(2));
  }
  {
    const ImportEvent e = Filled<ImportEvent>();
    json provenance = {{"from", *e.from},
                       {"model_type", *e.model_type},
                       {"files", *e.files},
                       {"dtypes", *e.dtypes}};
    EXPECT_EQ(e.ProvenanceToJson().dump(), provenance.dump());
    json old = {{"event", "import"}, {"at", e.at}, {"keel_version", e.keel_version}};
    for (const auto& [k, v] : provenance.items()) old[k] = v;
    EXPECT_EQ(Written(e), old.dump());
    ImportEvent bare;  // a test's import without provenance
    ASSERT_TRUE(bare.ProvenanceFromJson(json::object(), "p").ok());
    EXPECT_EQ(Written(bare), json({{"event", "import"}, {"at", ""}, {"keel_version", ""}}).dump());
    EXPECT_EQ(bare.ProvenanceFromJson({{"from", 3}}, "p").message(),
              "p: key 'from' must be a string, but is the number 3");
  }
}

TEST(JournalEventsTest, RunJournalAppendsATypedEventWithItsTime) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("keel_events_test_" + std::to_string(getpid())))
          .string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::vector<std::string> logged;
  RunJournal journal(Env::Default(), dir, [&](const std::string& s) { logged.push_back(s); });
  ReplicaMismatchEvent e;
  e.iteration = 12;
  e.message = "rank 1 differs";
  journal.Append(e, "iteration 12: rank 1 differs", "health: ");
  std::ifstream in(dir + "/" + kEventsFile);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  const json j = json::parse(line);
  ASSERT_TRUE(j.contains("at"));
  json without_at = j;
  without_at.erase("at");
  EXPECT_EQ(without_at.dump(), Written(e));
  ReplicaMismatchEvent back;
  ASSERT_TRUE(ReplicaMismatchEvent::FromJson(j, "events.jsonl line 1", &back).ok());
  EXPECT_EQ(back.message, "rank 1 differs");
  EXPECT_EQ(logged, std::vector<std::string>{"health: iteration 12: rank 1 differs"});
  std::filesystem::remove_all(dir);
}

TEST(JournalEventsTest, TheHeaderReadsAnyKindAndRefusesWrongTypes) {
  JournalLineHeader h;
  ASSERT_TRUE(JournalLineHeader::FromJson(json(Filled<RollbackEvent>().ToJson()), "l", &h).ok());
  EXPECT_EQ(h.event, "rollback");
  ASSERT_TRUE(h.iteration.has_value());
  ASSERT_TRUE(JournalLineHeader::FromJson(json(Filled<GuardStopEvent>().ToJson()), "l", &h).ok());
  EXPECT_FALSE(h.iteration.has_value());  // a decision about the run
  EXPECT_EQ(*h.reason, Filled<GuardStopEvent>().reason);
  ASSERT_TRUE(JournalLineHeader::FromJson(json::object(), "l", &h).ok());  // a foreign line
  EXPECT_EQ(JournalLineHeader::FromJson({{"iteration", 1.5}}, "l", &h).message(),
            "l: key 'iteration' must be an integer, but is the number 1.5");
  EXPECT_EQ(JournalLineHeader::FromJson({{"event", 7}}, "l", &h).message(),
            "l: key 'event' must be a string, but is the number 7");
  EXPECT_FALSE(JournalLineHeader::FromJson(json::array(), "l", &h).ok());
}

}  // namespace
}  // namespace keel

// RunJournal: the run's chronicle in its run directory (--save).
//   events.jsonl  one JSON object per line: every guard detection and decision, rollback, skipped
//                 range, LR change, restart; each with iteration, consumed samples and wall time
//   CHRONICLE.md  the same story in plain sentences, appended as it happens
// Each append is one write(2) of whole lines, flushed, so a crash loses at most the line being
// written and a reader (tail -f) never sees half an entry. Without a directory the sentences only
// go to the log.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "core/env.h"
#include "core/status.h"
#include "journal/journal_event.h"

namespace keel {

constexpr const char* kEventsFile = "events.jsonl";
constexpr const char* kChronicleFile = "CHRONICLE.md";

class RunJournal {
 public:
  using Logger = std::function<void(const std::string&)>;
  // `dir` empty: no files. `log` receives every sentence, prefixed with `prefix` (who decided).
  RunJournal(Env* env, std::string dir, Logger log, std::string prefix = "guard: ");

  // Appends `event` (with "at", the UTC wall time, added) and `sentence`. A failed append is
  // logged once as a warning and never stops training. An empty `sentence`: events.jsonl only.
  void Append(nlohmann::json event, const std::string& sentence);
  // The same, logged with `log_prefix` instead of the journal's own (e.g. "health: "); an empty
  // `log_prefix`: not logged (the caller logged it already).
  void Append(nlohmann::json event, const std::string& sentence, const std::string& log_prefix);
  // The same for a typed event (journal/events.h): its line, with "at" added.
  void Append(const JournalEvent& event, const std::string& sentence);
  void Append(const JournalEvent& event, const std::string& sentence,
              const std::string& log_prefix);
  // A heading line in CHRONICLE.md (e.g. at the start of each process).
  void Heading(const std::string& text);
  // Also called with every appended event and its sentence (e.g. to put it in TensorBoard).
  void set_observer(std::function<void(const nlohmann::json&, const std::string&)> f) {
    observer_ = std::move(f);
  }

 private:
  // Writes the event and the sentence to the files and tells the observer; logs nothing.
  void Record(nlohmann::json event, const std::string& sentence);
  void Write(const std::string& file, const std::string& text);
  Env* env_;
  std::string dir_;
  Logger log_;
  std::string prefix_;
  bool warned_ = false;
  std::function<void(const nlohmann::json&, const std::string&)> observer_;
};

}  // namespace keel

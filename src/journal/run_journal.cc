#include "journal/run_journal.h"

#include "core/timestamp.h"

namespace keel {

RunJournal::RunJournal(Env* env, std::string dir, Logger log, std::string prefix)
    : env_(env), dir_(std::move(dir)), log_(std::move(log)), prefix_(std::move(prefix)) {}

void RunJournal::Write(const std::string& file, const std::string& text) {
  if (dir_.empty()) return;
  std::unique_ptr<WritableFile> f;
  Status st = env_->NewAppendableFile(JoinPath(dir_, file), &f);
  if (st.ok()) st = f->Append(text);
  if (st.ok()) st = f->Close();
  if (!st.ok() && !warned_) {
    warned_ = true;
    if (log_) log_("WARNING: cannot append to the run journal: " + st.message());
  }
}

void RunJournal::Append(nlohmann::json event, const std::string& sentence) {
  if (log_) log_(prefix_ + sentence);
  Record(std::move(event), sentence);
}

void RunJournal::Append(nlohmann::json event, const std::string& sentence,
                        const std::string& log_prefix) {
  if (log_ && !log_prefix.empty()) log_(log_prefix + sentence);
  Record(std::move(event), sentence);
}

void RunJournal::Append(const JournalEvent& event, const std::string& sentence) {
  Append(nlohmann::json(event.ToJson()), sentence);
}

void RunJournal::Append(const JournalEvent& event, const std::string& sentence,
                        const std::string& log_prefix) {
  Append(nlohmann::json(event.ToJson()), sentence, log_prefix);
}

void RunJournal::Record(nlohmann::json event, const std::string& sentence) {
  event["at"] = UtcTimestamp();
  // A path or log text need not be UTF-8 (a file name with byte 0xff): such bytes become U+FFFD
  // rather than an exception that would end the writer (and a watch before its kill switch).
  Write(kEventsFile, event.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  if (sentence.empty()) return;  // a record for readers of events.jsonl only (goodput)
  Write(kChronicleFile, "- " + sentence + "\n");
  if (observer_) observer_(event, sentence);
}

void RunJournal::Heading(const std::string& text) {
  Write(kChronicleFile, "\n## " + text + "\n\n");
}

}  // namespace keel

// Goodput: where every second of a job went, across keel launch's restarts. Reads a run
// directory's events.jsonl (the training processes' goodput records, the guard's rollbacks, the
// watchdog's hangs, keel launch's attempt spans) and classifies the wall time from the first
// start to the last end into the categories below; their seconds sum to the wall time.
//
//   GoodputBreakdown g;
//   KEEL_RETURN_IF_ERROR(ComputeGoodput(env, "runs/x", &g));
//   std::printf("%s", FormatGoodputTable(g).c_str());
//
// docs/observability.md ("Goodput") says how each category is measured.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/env.h"
#include "core/status.h"

namespace keel {

// The categories, in the order they are shown: (key, label).
const std::vector<std::pair<std::string, std::string>>& GoodputCategories();

struct GoodputBreakdown {
  double wall_seconds = 0;
  std::vector<double> seconds;     // one per GoodputCategories(), summing to wall_seconds
  int processes = 0;               // training processes that began their loop
  int attempts = 0;                // keel launch's attempts (0: not under keel launch)
  bool estimate = false;           // from a log (keel logs analyze), not a journal
  std::vector<std::string> notes;  // what could not be seen, for an estimate

  double Of(const std::string& key) const;
  // {"wall_seconds": W, "categories": {"productive": s, ...}}
  nlohmann::ordered_json ToJson() const;
};

// From the lines of an events.jsonl, in order. NotFound when they hold no goodput record.
Status GoodputFromEvents(const std::vector<nlohmann::json>& lines, const std::string& where,
                         GoodputBreakdown* out);
// From RUN/events.jsonl. NotFound (naming the fix) when there is none or it has no records.
Status ComputeGoodput(Env* env, const std::string& run_dir, GoodputBreakdown* out);

// A table: each category's seconds and share of the wall time.
std::string FormatGoodputTable(const GoodputBreakdown& g);
// One sentence for the chronicle: the productive share and the largest others.
std::string GoodputSentence(const GoodputBreakdown& g);

}  // namespace keel

// Tools for TensorBoard event directories (keel's and any other writer's): rename tags in every
// event file, and truncate a run's curves after a step. Both rewrite each file through a
// temporary file renamed over it (atomic per file), after every file has been read and checked,
// so a malformed file stops the tool before anything changes.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/env.h"
#include "core/status.h"

namespace keel {

// The event files of `dir` (names containing "tfevents"), sorted.
Status ListEventFiles(Env* env, const std::string& dir, std::vector<std::string>* out);

struct TagRenameReport {
  int files = 0, files_changed = 0;
  std::map<std::string, int64_t> renamed;  // old tag -> events renamed
};
// Reads a tag map (`keel tb rename --map`): a JSON object of old tag -> new tag, both non-empty
// strings. `origin` names the file in the error.
Status ParseTagMap(const std::string& text, const std::string& origin,
                   std::map<std::string, std::string>* map);
// Renames every event whose tag is a key of `map` to its value, one pass per file.
Status RenameTags(Env* env, const std::string& dir, const std::map<std::string, std::string>& map,
                  TagRenameReport* report);

struct TruncateReport {
  std::string archive;          // where the original files went ("" if nothing followed the step)
  int64_t kept = 0, moved = 0;  // events
};
// Keeps the events up to iteration `step` and moves the original files whole to
// DIR/tb-archive/truncate-after-step-N-<time>/. Tags "X vs samples" / "X vs tokens" keep as many
// events as their tag X keeps in the same file (writers emit them in pairs, in order).
Status TruncateAfterStep(Env* env, const std::string& dir, int64_t step, TruncateReport* report);

}  // namespace keel

// Atomic rewrite of some files of an existing checkpoint (used by `keel ckpt edit`): the new
// version is assembled in SAVE/.edit.iter_N (unchanged files hard-linked, replaced files written
// and fsynced, a fresh manifest), then swapped with iter_N in one renameat2(RENAME_EXCHANGE), and
// the old version removed. Readers see the old or the new checkpoint, never a mix or neither; a
// crash leaves at most a .edit.* leftover, which CheckpointStore::Recover() removes.
#pragma once

#include <map>
#include <string>

#include "core/env.h"
#include "core/status.h"

namespace keel {

// `dir` must be a checkpoint directory that verifies; `replaced` maps file names (existing or new)
// to their new contents.
Status RewriteCheckpointFiles(Env* env, const std::string& dir,
                              const std::map<std::string, std::string>& replaced);

}  // namespace keel

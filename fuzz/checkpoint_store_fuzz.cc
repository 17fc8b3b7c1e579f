// A run directory's bookkeeping, as every resume and `keel ckpt list/pin/unpin` read it: the
// marker latest_checkpointed_iteration.txt, pins.json and the names of the directories in it.
// Input: marker text, pins.json and a list of directory names (one per line), split at the
// separator; each directory gets a tiny manifest naming the iteration its name says.
#include <cstddef>
#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_store.h"
#include "checkpoint/manifest.h"
#include "fuzz_input.h"
#include "mem_env.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string> parts = keel::fuzz::SplitInput(data, size, 3);
  keel::fuzz::MemEnv env;
  env.Put("/run/latest_checkpointed_iteration.txt", parts[0]);
  env.Put("/run/pins.json", parts[1]);
  std::istringstream names(parts[2]);
  int dirs = 0;
  for (std::string name; std::getline(names, name) && dirs < 16; ++dirs) {
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
      continue;
    int64_t it = 0;
    keel::Manifest m;
    m.iteration = keel::ParseCheckpointDirName(name, &it) ? it : dirs;
    env.Put("/run/" + name + "/manifest.json", m.ToJson());
  }
  keel::CheckpointStore store(&env, "/run", [](const std::string&) {});
  std::vector<keel::CheckpointInfo> list;
  (void)store.List(&list);
  int64_t marker = 0;
  (void)store.ReadMarker(&marker);
  std::map<int64_t, std::string> pins;
  if (store.ReadPins(&pins).ok()) {
    (void)store.Pin(7, "fuzz");
    (void)store.Unpin(7);
  }
  keel::CheckpointInfo newest;
  (void)store.FindNewestValid(/*move_aside_rejected=*/true, &newest);
  return 0;
}

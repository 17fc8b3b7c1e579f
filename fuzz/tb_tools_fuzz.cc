// `keel tb rename` and `keel tb truncate` on a TensorBoard directory holding the input as an
// event file (CRCs recomputed as in tf_event_fuzz, so the tools get past the framing). After the
// separator, an optional `--map` file: renamed with it when it parses, else with a fixed map.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "fuzz_input.h"
#include "mem_env.h"
#include "metrics/tb_tools.h"
#include "metrics/tf_event.h"
#include "tfrecord_crcs.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string> parts = keel::fuzz::SplitInput(data, size, 2);
  keel::fuzz::MemEnv env;
  env.Put("/run/tensorboard/events.out.tfevents.1.host", keel::fuzz::FixRecordCrcs(parts[0]));
  keel::TagRenameReport renamed;
  std::map<std::string, std::string> map;
  if (!keel::ParseTagMap(parts[1], "--map map.json", &map).ok())
    map = {{"lm-loss-training/lm loss", "train/loss"}, {"lm loss", "loss"}};
  (void)keel::RenameTags(&env, "/run/tensorboard", map, &renamed);
  keel::TruncateReport truncated;
  (void)keel::TruncateAfterStep(&env, "/run/tensorboard", 10, &truncated);
  return 0;
}

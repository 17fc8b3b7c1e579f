// `keel logs watch` on a log that arrives in pieces: the input (less its first byte, which says
// into how many pieces it is cut) is appended piece by piece to a file of an in-memory Env and
// followed (LogFollower), parsed a line at a time (MegatronLogParser) and watched (LogWatcher, with
// a kill switch on every kind). The records read that way must be the records ParseMegatronLog
// reads from the whole text at once; a difference aborts. NUL bytes are left out of the text: the
// follower drops them (a copytruncate hole), the whole-text parser does not.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "fuzz_input.h"
#include "logs/log_follower.h"
#include "logs/log_watcher.h"
#include "logs/megatron_log.h"
#include "mem_env.h"

namespace {

// The ends of the pieces: `n` cut points, spread by a generator seeded with the text's size.
std::vector<size_t> Cuts(size_t size, int n) {
  std::vector<size_t> cuts;
  uint64_t state = size * 2654435761u + 1;
  for (int i = 1; i < n; ++i) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    cuts.push_back(size == 0 ? 0 : static_cast<size_t>((state >> 33) % (size + 1)));
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.push_back(size);
  return cuts;
}

bool Same(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, sizeof a) == 0;
}

bool SameRecord(const keel::LogRecord& a, const keel::LogRecord& b) {
  return a.iteration == b.iteration && a.train_iters == b.train_iters && a.line == b.line &&
         a.consumed_samples == b.consumed_samples && a.skipped == b.skipped && a.nan == b.nan &&
         a.after_start == b.after_start && a.gap == b.gap && a.nonfinite == b.nonfinite &&
         Same(a.lm_loss, b.lm_loss) && Same(a.grad_norm, b.grad_norm) && Same(a.tflops, b.tflops) &&
         a.timestamp == b.timestamp;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int pieces = 1 + data[0] % 8;
  std::string text;
  for (size_t i = 1; i < size; ++i)
    if (data[i] != 0) text += static_cast<char>(data[i]);
  const std::vector<size_t> cuts = Cuts(text.size(), pieces);
  const std::string path = "/logs/main_log.txt";

  // Followed and parsed a line at a time ...
  keel::fuzz::MemEnv env;
  keel::LogFollower follower(&env, path);
  keel::ParsedLog live;
  keel::MegatronLogParser parser(&live);
  parser.BeginFile(path);
  for (size_t end : cuts) {
    env.Put(path, text.substr(0, end));
    bool more = true;
    while (more) {
      std::vector<keel::FollowedItem> items;
      if (!follower.Poll(&items, &more).ok()) __builtin_trap();
      for (const keel::FollowedItem& item : items)
        if (item.kind == keel::FollowedItem::Kind::kLine)
          parser.AddLine(item.text);
        else if (item.kind == keel::FollowedItem::Kind::kNewFile)
          __builtin_trap();  // appends only
    }
  }
  std::string last;
  if (follower.TakePartialLine(&last)) parser.AddLine(last);
  parser.Flush();
  // ... reads what the whole text reads.
  keel::ParsedLog whole;
  (void)keel::ParseMegatronLog(text, path, &whole);
  if (live.records.size() != whole.records.size() || live.lines != whole.lines ||
      live.wrapped != whole.wrapped || live.validations.size() != whole.validations.size() ||
      live.rejected.size() != whole.rejected.size())
    __builtin_trap();
  for (size_t i = 0; i < live.records.size(); ++i)
    if (!SameRecord(live.records[i], whole.records[i])) __builtin_trap();

  // The watcher on the same pieces, its kill switch armed for everything: it must not crash.
  keel::fuzz::MemEnv wenv;
  (void)wenv.CreateDirs("/out");
  keel::LogWatchOptions opt;
  opt.log = path;
  opt.out_dir = "/out/watch";
  opt.analysis.drop_window = 3;
  opt.analysis.detector.min_history = 2;
  opt.kill_switch = "/out/stop";
  opt.kill_on = keel::LogEventKinds();
  keel::LogWatcher watcher(&wenv, opt, nullptr, nullptr);
  if (!watcher.Open().ok()) __builtin_trap();
  for (size_t end : cuts) {
    wenv.Put(path, text.substr(0, end));
    bool more = true, read = false;
    while (more)
      if (!watcher.Poll(&more, &read).ok()) __builtin_trap();
  }
  watcher.Finish("the end of the input");
  return 0;
}

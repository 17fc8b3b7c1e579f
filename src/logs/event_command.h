// EventCommandRunner: runs the `--on-event CMD` of `keel logs watch` for a finding without ever
// holding the watcher up. The command runs through /bin/sh -c in a session of its own, so a Ctrl-C
// meant for the watcher does not reach it and the watcher's end does not end it; the finding is in
// its environment (KEEL_EVENT_*) and on its stdin (one JSON line). Between the watcher and the
// command sits a small guardian process that ends the command's process group after `timeout_s`
// (SIGTERM, then SIGKILL 5 s later), so a command that hangs is ended even when the watcher was
// killed outright. Production uses NewPosixEventCommandRunner(); tests substitute a recorder.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/env.h"
#include "core/status.h"

namespace keel {

// How a command ended: `what` is a sentence ("exited with status 3 after 0.2 s", "was ended
// after its timeout of 30 s").
struct CommandEnd {
  std::string label;
  bool ok = false;  // exited with status 0
  std::string what;
};

class EventCommandRunner {
 public:
  virtual ~EventCommandRunner() = default;
  // Starts `command` with `vars` added to this process's environment and `stdin_text` on its
  // stdin; `label` names it in Reap. Never waits for it. An error when it cannot be started.
  virtual Status Start(const std::string& label, const std::string& command,
                       const std::vector<std::pair<std::string, std::string>>& vars,
                       const std::string& stdin_text, double timeout_s) = 0;
  // The commands that ended since the last call.
  virtual std::vector<CommandEnd> Reap() = 0;
  virtual int running() const = 0;
};

// fork, setsid, a guardian with alarm(2), /bin/sh -c. The clock of `env` times the commands.
std::unique_ptr<EventCommandRunner> NewPosixEventCommandRunner(Env* env);

}  // namespace keel

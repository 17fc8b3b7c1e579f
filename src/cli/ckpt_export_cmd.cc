// `keel ckpt export PATH --hf OUT`.
#include "cli/commands.h"
#include "core/log.h"

namespace keel::cli {

int CkptExportCommand(int argc, const char* const* argv) {
  LogError("error: keel ckpt export is not written yet");
  return 2;
}

}  // namespace keel::cli

// `keel ckpt`: tools for checkpoints (see docs/checkpoints.md).
#include <cstring>
#include <string>

#include "cli/commands.h"
#include "core/log.h"

namespace keel::cli {

int CkptCommand(int argc, const char* const* argv) {
  if (argc >= 2 && std::strcmp(argv[1], "export") == 0) return CkptExportCommand(argc - 1, argv + 1);
  LogError("error: usage: keel ckpt export PATH --hf OUT (other tools are not written yet)");
  return 2;
}

}  // namespace keel::cli

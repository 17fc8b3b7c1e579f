// Backends by name. The training run and the CLI make theirs from --backend, so a second backend
// (CUDA) is one more entry here instead of a change at every call site.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"

namespace keel {

// threads: as MakeCpuBackend's (<= 0: all cores); a backend without host threads ignores it.
using BackendFactory = std::function<std::unique_ptr<Backend>(int threads)>;

// The backend whose memory is host memory: tools that only hold weights on their way between
// files (checkpoint verify, Hugging Face import) use it whatever backend trained the run.
inline constexpr char kHostBackend[] = "cpu";

// Makes the backend called `name` ("cpu"); InvalidArgument naming the known backends otherwise.
Status MakeBackend(const std::string& name, int threads, std::unique_ptr<Backend>* out);
// The names MakeBackend knows, sorted.
std::vector<std::string> BackendNames();
// Adds (or replaces) the backend called `name`: tests register decorated backends with it.
void RegisterBackend(const std::string& name, BackendFactory factory);

}  // namespace keel

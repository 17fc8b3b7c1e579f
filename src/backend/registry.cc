#include "backend/registry.h"

#include <fmt/format.h>

#include <map>
#include <mutex>
#include <utility>

#ifdef KEEL_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace keel {
namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, BackendFactory> factories;
};

Registry& TheRegistry() {
  static Registry* r = [] {
    auto* reg = new Registry;
    reg->factories["cpu"] = [](int threads) { return MakeCpuBackend(threads); };
#ifdef KEEL_WITH_CUDA
    reg->factories["cuda"] = [](int) { return MakeCudaBackend(); };
#endif
    return reg;
  }();
  return *r;
}

}  // namespace

Status MakeBackend(const std::string& name, int threads, std::unique_ptr<Backend>* out) {
  BackendFactory factory;
  {
    Registry& r = TheRegistry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.factories.find(name);
    if (it != r.factories.end()) factory = it->second;
  }
  if (!factory && name == "cuda") {
    return Status::InvalidArgument(
        "--backend cuda: this keel was built without CUDA: configure with -DKEEL_CUDA=ON on a "
        "machine with nvcc (scripts/device-check.sh does)");
  }
  if (!factory) {
    return Status::InvalidArgument(fmt::format("--backend {}: no such backend; this build has: {}",
                                               name, fmt::join(BackendNames(), ", ")));
  }
#ifdef KEEL_WITH_CUDA
  // A CUDA build on a machine without a usable GPU: a message, not an exception from the factory.
  if (name == "cuda") KEEL_RETURN_IF_ERROR(CudaDeviceAvailable());
#endif
  *out = factory(threads);
  return Status::OK();
}

std::vector<std::string> BackendNames() {
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> names;
  for (const auto& [name, factory] : r.factories) names.push_back(name);
  return names;
}

void RegisterBackend(const std::string& name, BackendFactory factory) {
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.factories[name] = std::move(factory);
}

}  // namespace keel

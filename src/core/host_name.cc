#include "core/host_name.h"

#include <unistd.h>

#include <mutex>

namespace keel {
namespace {

std::mutex mu;
std::string& Override() {
  static std::string name;
  return name;
}

}  // namespace

std::string ThisHostName() {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!Override().empty()) return Override();
  }
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) return "?";
  return host;
}

void OverrideHostNameForTesting(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu);
  Override() = name;
}

}  // namespace keel

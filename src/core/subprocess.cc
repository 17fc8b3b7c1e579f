#include "core/subprocess.h"

#include <set>
#include <utility>

extern char** environ;

namespace keel {

std::vector<std::string> EnvironmentWith(const std::vector<std::string>& added) {
  std::set<std::string> replaced;
  for (const std::string& e : added) replaced.insert(e.substr(0, e.find('=')));
  std::vector<std::string> out;
  for (char** e = environ; *e; ++e) {
    const std::string entry = *e;
    if (!replaced.count(entry.substr(0, entry.find('=')))) out.push_back(entry);
  }
  out.insert(out.end(), added.begin(), added.end());
  return out;
}

ExecVectors::ExecVectors(std::vector<std::string> args, std::vector<std::string> env)
    : args_(std::move(args)), env_(std::move(env)) {
  for (std::string& a : args_) argv_.push_back(a.data());
  argv_.push_back(nullptr);
  for (std::string& e : env_) envp_.push_back(e.data());
  envp_.push_back(nullptr);
}

}  // namespace keel

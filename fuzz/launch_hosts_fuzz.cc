// `keel launch`'s hosts: a --hostfile (Open MPI's format; also SAVE/hosts.readmit), which must
// read back the same from what FormatHostfile writes of it, and a SLURM_JOB_NODELIST. Input: the
// hostfile, then the node list.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_input.h"
#include "launch/hosts.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string> parts = keel::fuzz::SplitInput(data, size, 2);
  std::vector<keel::HostEntry> hosts, again;
  if (keel::ParseHostfile(parts[0], "hosts", &hosts).ok()) {
    if (!keel::ParseHostfile(keel::FormatHostfile(hosts), "hosts", &again).ok() ||
        again.size() != hosts.size())
      __builtin_trap();
    for (size_t i = 0; i < hosts.size(); ++i)
      if (again[i].name != hosts[i].name || again[i].slots != hosts[i].slots ||
          again[i].extra != hosts[i].extra)
        __builtin_trap();
  }
  std::vector<std::string> nodes;
  if (keel::ExpandSlurmNodeList(parts[1], &nodes).ok())
    for (const std::string& n : nodes)
      if (n.empty() || n.find_first_of(",[]") != std::string::npos) __builtin_trap();
  return 0;
}

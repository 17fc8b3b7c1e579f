// The name of the host this process runs on, as keel writes it into hang dumps, straggler events,
// lock files and logs: gethostname(), unless a test gave the process another (KEEL_TEST_HOSTNAME,
// read by train/test_hooks.cc) so that ranks on one machine can play ranks on several hosts.
#pragma once

#include <string>

namespace keel {

std::string ThisHostName();
// TEST-ONLY: what ThisHostName returns from now on in this process (empty: gethostname again).
void OverrideHostNameForTesting(const std::string& name);

}  // namespace keel

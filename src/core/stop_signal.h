// Stop requests by signal: SIGTERM (what Slurm and Kubernetes send before killing a job) and
// SIGUSR1 (what Slurm's --signal sends ahead of the time limit) set a flag; the train loop checks
// it after each iteration, saves a checkpoint and exits within the grace period.
#pragma once

namespace keel {

// Installs the handlers (idempotent). A second signal of the same kind while the save runs is
// ignored rather than killing the save half-way.
void InstallStopSignalHandlers();
// The signal number received since installation, or 0.
int PendingStopSignal();
// For tests: forget a received signal.
void ClearStopSignal();

}  // namespace keel

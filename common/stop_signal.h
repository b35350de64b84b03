// SIGTERM as a preemption notice (a cloud's or Slurm's warning before a node is taken away). The
// first SIGTERM asks the training loop to stop at the next step boundary: it writes a checkpoint,
// leaves the job (parameter servers count the node out at once) and exits 0. So that nothing ever
// waits on a stuck process, a second SIGTERM, or the grace period passing without an exit, ends
// the process at once with status 143 (128 + SIGTERM), as the default action would.
#pragma once

namespace syncopate {

// Installs the handler (once per process; later calls only change the grace period, seconds).
void install_stop_signal(double grace_s);
// A SIGTERM has arrived: stop after the step in progress.
bool stop_requested();

}  // namespace syncopate

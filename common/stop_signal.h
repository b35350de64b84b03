// SIGTERM as a preemption notice (a cloud's or Slurm's warning before a node is taken away). The
// first SIGTERM asks the training loop to stop at the next step boundary: it writes a checkpoint,
// leaves the job (parameter servers count the node out at once) and exits 0. So that nothing ever
// waits on a stuck process, a second SIGTERM (2 s or more after the first: launchers and Slurm
// often deliver one notice twice), or the grace period passing without an exit, ends the process
// at once with status 143 (128 + SIGTERM), as the default action would. SIGTERM is blocked in
// every thread started after install and taken by one waiting thread, so no blocking call
// (ZeroMQ, sockets, waits) is interrupted by it. Install first thing in main().
#pragma once

namespace syncopate {

// Installs it (once per process, before any thread starts; later calls only set the grace period, seconds).
void install_stop_signal(double grace_s);
// A SIGTERM has arrived: stop after the step in progress.
bool stop_requested();

}  // namespace syncopate

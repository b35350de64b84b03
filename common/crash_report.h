// A fatal signal (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT) prints the faulting address, the
// faulting instruction, the thread and the native stack as far as it unwinds to stderr (once: a
// second thread faulting meanwhile waits) before the process dies as it would have (the default action is restored and the signal
// raised again: the exit status stays 128 + signal and a core is dumped where enabled). The
// addresses of our own frames are given as binary(+offset): `addr2line -f -e BINARY OFFSET` on an
// unstripped build of the same commit names them. Without it, a crash at exit (a destructor after
// the last step) leaves only "exited 139" and a log whose buffered lines are lost; this also
// flushes stdout's buffer first. Install first thing in main(), beside install_stop_signal.
#pragma once

namespace syncopate {

// Installs the handler for the signals above (on an alternate stack, so a stack overflow is
// reported too); `program` names the process in the report. Idempotent.
void install_crash_report(const char* program);

}  // namespace syncopate

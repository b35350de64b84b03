#include "common/crash_report.h"

#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>

namespace syncopate {
namespace {

const char* g_program = "syncopate";
std::atomic<bool> g_reporting{false};

void write_str(const char* s) {
  const size_t n = std::strlen(s);
  ssize_t w = ::write(STDERR_FILENO, s, n);
  (void)w;
}

void on_fatal(int sig) {
  if (!g_reporting.exchange(true)) {  // one report, even if the report itself faults
    std::fflush(stdout);  // not async-signal-safe, but the process is dying and its log is worth it
    write_str("\n");
    write_str(g_program);
    write_str(": fatal signal ");
    write_str(sig == SIGSEGV ? "SIGSEGV (invalid memory access)"
              : sig == SIGBUS ? "SIGBUS (bus error)"
              : sig == SIGILL ? "SIGILL (illegal instruction)"
              : sig == SIGFPE ? "SIGFPE (arithmetic error)"
              : sig == SIGABRT ? "SIGABRT (abort)" : "(other)");
    write_str("; native stack (addr2line -f -e BINARY +OFFSET names our frames):\n");
    void* frames[128];
    const int n = ::backtrace(frames, 128);
    ::backtrace_symbols_fd(frames, n, STDERR_FILENO);
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

void install_crash_report(const char* program) {
  static bool installed = false;
  if (installed) return;
  installed = true;
  g_program = program;
  void* warm[1];
  ::backtrace(warm, 1);  // loads libgcc's unwinder now, not inside the handler
  static char alt[64 * 1024];
  stack_t ss{};
  ss.ss_sp = alt;
  ss.ss_size = sizeof alt;
  ::sigaltstack(&ss, nullptr);
  struct sigaction sa{};
  sa.sa_handler = on_fatal;
  sa.sa_flags = SA_ONSTACK | SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  for (int s : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) ::sigaction(s, &sa, nullptr);
}

}  // namespace syncopate

#include "common/crash_report.h"

#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <ucontext.h>
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

// An unsigned number in hex, into buf (async-signal-safe; no printf).
const char* hex(uintptr_t v, char (&buf)[24]) {
  char* p = buf + sizeof buf;
  *--p = 0;
  do {
    *--p = "0123456789abcdef"[v & 15];
    v >>= 4;
  } while (v);
  *--p = 'x';
  *--p = '0';
  return p;
}

void on_fatal(int sig, siginfo_t* info, void* uc) {
  // One report: a second thread faulting meanwhile waits here for the first to end the process.
  if (g_reporting.exchange(true)) {
    for (;;) ::pause();
  }
  {
    std::fflush(stdout);  // not async-signal-safe, but the process is dying and its log is worth it
    write_str("\n");
    write_str(g_program);
    write_str(": fatal signal ");
    write_str(sig == SIGSEGV ? "SIGSEGV (invalid memory access)"
              : sig == SIGBUS ? "SIGBUS (bus error)"
              : sig == SIGILL ? "SIGILL (illegal instruction)"
              : sig == SIGFPE ? "SIGFPE (arithmetic error)"
              : sig == SIGABRT ? "SIGABRT (abort)" : "(other)");
    char buf[24];
    write_str(" at address ");
    write_str(hex(reinterpret_cast<uintptr_t>(info ? info->si_addr : nullptr), buf));
#if defined(__x86_64__) && defined(REG_RIP)
    // The faulting instruction: where the unwinder cannot go past the signal frame (a call through
    // a bad pointer), it still names the code that faulted (addr2line, or the loaded libraries' map).
    if (uc) {
      write_str(", instruction ");
      write_str(hex(static_cast<uintptr_t>(static_cast<ucontext_t*>(uc)->uc_mcontext.gregs[REG_RIP]), buf));
    }
#endif
    write_str(", thread ");
    write_str(hex(static_cast<uintptr_t>(::syscall(SYS_gettid)), buf));
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
  static char alt[64 * 1024];  // the installing (main) thread's; other threads run the handler on their own stacks
  stack_t ss{};
  ss.ss_sp = alt;
  ss.ss_size = sizeof alt;
  ::sigaltstack(&ss, nullptr);
  struct sigaction sa{};
  sa.sa_sigaction = on_fatal;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;  // (not RESETHAND: a second faulting thread must wait, not kill the report)
  sigemptyset(&sa.sa_mask);
  for (int s : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) ::sigaction(s, &sa, nullptr);
}

}  // namespace syncopate

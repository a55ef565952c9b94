// A GPU test that crashes on the device machine says where: a fatal signal
// prints this process's stack to stderr (into the test's log that
// tools/gpu-check keeps) before the default action ends it. The device
// machine has no gdb and a few minutes in all, so a crash must explain
// itself in the one run that sees it. gpu_tests is linked with its symbols
// exported (ENABLE_EXPORTS), so the frames name their functions; the rest
// resolve with addr2line against the same build.
#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>

namespace {

void print_stack_and_die(int sig) {
  // Only async-signal-safe calls here (write, backtrace after its first
  // call has loaded libgcc, which install() made sure of).
  const char* name = sig == SIGSEGV  ? "SIGSEGV"
                     : sig == SIGBUS ? "SIGBUS"
                     : sig == SIGILL ? "SIGILL"
                     : sig == SIGFPE ? "SIGFPE"
                                     : "SIGABRT";
  static const char head[] = "\n== fatal signal ";
  static const char tail[] = ": the stack (tests/gpu/crash_backtrace.cpp)\n";
  (void)!::write(STDERR_FILENO, head, sizeof(head) - 1);
  (void)!::write(STDERR_FILENO, name, std::strlen(name));
  (void)!::write(STDERR_FILENO, tail, sizeof(tail) - 1);
  void* frames[48];
  const int n = ::backtrace(frames, 48);
  ::backtrace_symbols_fd(frames, n, STDERR_FILENO);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

const bool installed = [] {
  void* warm[1];
  (void)::backtrace(warm, 1);  // loads the unwinder now, not inside the handler
  struct sigaction sa {};
  sa.sa_handler = print_stack_and_die;
  sa.sa_flags = SA_RESETHAND | SA_NODEFER;
  ::sigemptyset(&sa.sa_mask);
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT})
    ::sigaction(sig, &sa, nullptr);
  return true;
}();

}  // namespace

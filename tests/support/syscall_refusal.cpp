#include "support/syscall_refusal.h"

#include <fmt/format.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <utility>

namespace kvrelay::testing {
namespace {

#if defined(__x86_64__)
constexpr uint32_t kThisArch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
constexpr uint32_t kThisArch = AUDIT_ARCH_AARCH64;
#else
constexpr uint32_t kThisArch = 0;
#endif

const std::pair<const char*, long> kKnown[] = {
    {"pidfd_open", SYS_pidfd_open},
    {"membarrier", SYS_membarrier},
    {"sched_setattr", SYS_sched_setattr},
    {"sched_getattr", SYS_sched_getattr},
    {"waitid", SYS_waitid},
    {"memfd_create", SYS_memfd_create},
};

}  // namespace

Result<std::vector<long>> syscall_numbers(const std::vector<std::string>& names) {
  std::vector<long> out;
  for (const std::string& name : names) {
    bool found = false;
    for (const auto& [known, number] : kKnown) {
      if (name != known) continue;
      out.push_back(number);
      found = true;
    }
    if (!found)
      return make_error(Errc::kInvalidArgument, fmt::format("unknown system call '{}'", name));
  }
  return out;
}

Status refuse_syscalls(const std::vector<long>& numbers, int error) {
  if (kThisArch == 0)
    return make_error(Errc::kUnsupported, "no seccomp filter for this architecture");
  std::vector<sock_filter> code;
  code.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)));
  // Calls of another ABI (x32, say) go through untouched.
  code.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kThisArch, 1, 0));
  code.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
  code.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)));
  for (long number : numbers) {
    code.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(number), 0, 1));
    code.push_back(BPF_STMT(BPF_RET | BPF_K,
                            SECCOMP_RET_ERRNO | (static_cast<uint32_t>(error) & SECCOMP_RET_DATA)));
  }
  code.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
  const sock_fprog program{static_cast<unsigned short>(code.size()), code.data()};
  // Without privileges a filter needs no_new_privs (set-uid programs run
  // after it gain nothing).
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
    return system_error("PR_SET_NO_NEW_PRIVS", errno);
  if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &program) != 0)
    return system_error("seccomp", errno);
  return {};
}

}  // namespace kvrelay::testing

// kvrelay-test-refuse-syscalls ERRNO CALL[,CALL...] PROGRAM [ARGS...]
//
// Runs PROGRAM (exec: the pid stays) with the named system calls failing
// with ERRNO (EPERM or ENOSYS), as under a strict container profile or an
// older kernel. A test prefix (InstanceArgs::prefix), not a user's tool.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "support/syscall_refusal.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s EPERM|ENOSYS CALL[,CALL...] PROGRAM [ARGS...]\n", argv[0]);
    return 2;
  }
  const std::string error_name = argv[1];
  int error = 0;
  if (error_name == "EPERM") error = EPERM;
  if (error_name == "ENOSYS") error = ENOSYS;
  if (error == 0) {
    std::fprintf(stderr, "%s: the error must be EPERM or ENOSYS, not '%s'\n", argv[0], argv[1]);
    return 2;
  }
  std::vector<std::string> names;
  std::stringstream list(argv[2]);
  for (std::string name; std::getline(list, name, ',');)
    names.push_back(name);
  kvrelay::Result<std::vector<long>> numbers = kvrelay::testing::syscall_numbers(names);
  if (!numbers) {
    std::fprintf(stderr, "%s: %s\n", argv[0], numbers.error().message.c_str());
    return 2;
  }
  if (kvrelay::Status s = kvrelay::testing::refuse_syscalls(*numbers, error); !s) {
    std::fprintf(stderr, "%s: %s\n", argv[0], s.error().message.c_str());
    return 3;
  }
  execv(argv[3], argv + 3);
  std::fprintf(stderr, "%s: exec %s: %s\n", argv[0], argv[3], std::strerror(errno));
  return 127;
}

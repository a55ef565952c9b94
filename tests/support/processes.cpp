#include "support/processes.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>
#include <thread>

namespace kvrelay::testing {

pid_t fork_child(const std::function<int()>& body) {
  const pid_t pid = fork();
  if (pid == 0) {
    int code = 99;
    try {
      code = body();
    } catch (...) {
      code = 99;
    }
    _exit(code);
  }
  return pid;
}

std::optional<ChildExit> wait_child(pid_t pid, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      ChildExit e;
      if (WIFEXITED(status)) {
        e.exited = true;
        e.code = WEXITSTATUS(status);
      } else if (WIFSIGNALED(status)) {
        e.signal = WTERMSIG(status);
      }
      return e;
    }
    if (r < 0 && errno != EINTR) return std::nullopt;
    if (std::chrono::steady_clock::now() >= until) {
      kill_child(pid);
      return std::nullopt;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void kill_child(pid_t pid) {
  kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
}

int run_in_child(const std::function<int()>& body, std::chrono::milliseconds timeout) {
  const std::optional<ChildExit> e = wait_child(fork_child(body), timeout);
  return e && e->exited ? e->code : -1;
}

std::string unique_instance(const std::string& suffix) {
  std::string name = "t" + std::to_string(getpid()) + "-";
  for (char c : suffix) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_';
    name.push_back(ok ? c : '_');
  }
  if (name.size() > 60) {  // keep the end (it tells instances of one test apart)
    name = name.substr(0, 30) + name.substr(name.size() - 30);
  }
  return name;
}

std::string current_test_instance() {
  return unique_instance(::testing::UnitTest::GetInstance()->current_test_info()->name());
}

uint64_t rss_kib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6));
  return 0;
}

uint64_t cpu_ticks(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return 0;
  std::istringstream fields(line.substr(line.rfind(')') + 2));
  std::string f;
  uint64_t utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> f; ++i) {  // fields 14 and 15: utime, stime
    if (i == 14) utime = std::stoull(f);
    if (i == 15) stime = std::stoull(f);
  }
  return utime + stime;
}

ReadyPipe::ReadyPipe() {
  if (pipe2(fds_, O_CLOEXEC) != 0) fds_[0] = fds_[1] = -1;
}

ReadyPipe::~ReadyPipe() {
  if (fds_[0] >= 0) close(fds_[0]);
  if (fds_[1] >= 0) close(fds_[1]);
}

void ReadyPipe::signal() {
  const char b = 1;
  (void)!write(fds_[1], &b, 1);
}

bool ReadyPipe::wait(std::chrono::milliseconds timeout) {
  pollfd p{fds_[0], POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(timeout.count())) != 1) return false;
  char b = 0;
  return read(fds_[0], &b, 1) == 1;
}

}  // namespace kvrelay::testing

#include <sys/mman.h>

#include <stdexcept>

namespace kvrelay::testing {

SharedRegion::SharedRegion(size_t bytes) : bytes_(bytes) {
  data_ = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (data_ == MAP_FAILED) throw std::runtime_error("mmap failed");
}

SharedRegion::~SharedRegion() {
  munmap(data_, bytes_);
}

}  // namespace kvrelay::testing

namespace kvrelay::testing {

SharedFileRegion::SharedFileRegion(size_t bytes) : bytes_(bytes) {
  fd_ = memfd_create("kvrelay-test-region", MFD_CLOEXEC);
  if (fd_ < 0 || ftruncate(fd_, static_cast<off_t>(bytes)) != 0)
    throw std::runtime_error("memfd failed");
  data_ = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (data_ == MAP_FAILED) throw std::runtime_error("mmap failed");
}

SharedFileRegion::~SharedFileRegion() {
  munmap(data_, bytes_);
  if (own_fd_ >= 0 && owner_pid_ == getpid()) close(own_fd_);
  close(fd_);
}

LockSpace SharedFileRegion::locks() {
  if (owner_pid_ != getpid()) {
    // A forked child shares its parent's descriptions: open one of its own.
    own_fd_ = open(("/proc/self/fd/" + std::to_string(fd_)).c_str(), O_RDWR | O_CLOEXEC);
    owner_pid_ = getpid();
  }
  return LockSpace{own_fd_, 0};
}

}  // namespace kvrelay::testing

// Helpers for tests that run real processes: fork children that run a
// function, wait for them with a deadline (never forever), and give each test
// its own instance name so that ctest -j cannot make tests collide.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>

namespace kvrelay::testing {

// Forks; the child runs `body` and _exits with its return value (a thrown
// exception or a failed gtest assertion inside the child becomes exit 99).
pid_t fork_child(const std::function<int()>& body);

struct ChildExit {
  bool exited = false;  // normal exit
  int code = -1;
  int signal = 0;
};

// Waits for `pid` up to `timeout`; on timeout kills it (SIGKILL) and
// returns nullopt, so a hung child fails the test instead of hanging it.
std::optional<ChildExit> wait_child(pid_t pid, std::chrono::milliseconds timeout);

// Kills with SIGKILL and reaps.
void kill_child(pid_t pid);

// Runs `body` in a child and waits for it (up to `timeout`): its exit code,
// or -1 when it did not exit normally in time. For cases that change the
// process for good (a seccomp filter, a scheduler slice).
int run_in_child(const std::function<int()>& body,
                 std::chrono::milliseconds timeout = std::chrono::seconds(30));

// "t<pid>-<suffix>": unique per test process, a valid instance name (other
// characters become '_', long names keep their start and end).
std::string unique_instance(const std::string& suffix);
// unique_instance() of the running GoogleTest test's name.
std::string current_test_instance();

// What /proc says of a process: resident memory (KiB) and CPU time used so
// far (user + system, in clock ticks); 0 when it is gone.
uint64_t rss_kib(pid_t pid);
uint64_t cpu_ticks(pid_t pid);

// How much more resident memory the same work takes in this build: TSan
// keeps shadow memory (several bytes per application byte) and a quarantine
// that returns nothing; ASan keeps a quarantine. Memory bounds in tests are
// multiplied by it.
constexpr uint64_t sanitizer_memory_factor() {
#if defined(__SANITIZE_THREAD__)
  return 4;
#elif defined(__SANITIZE_ADDRESS__)
  return 2;
#else
  return 1;
#endif
}

// A one-byte pipe for "I am ready" handshakes between parent and child.
class ReadyPipe {
 public:
  ReadyPipe();
  ~ReadyPipe();
  ReadyPipe(const ReadyPipe&) = delete;
  ReadyPipe& operator=(const ReadyPipe&) = delete;
  void signal();                                 // child side
  bool wait(std::chrono::milliseconds timeout);  // parent side

 private:
  int fds_[2];
};

}  // namespace kvrelay::testing

namespace kvrelay::testing {

// Anonymous MAP_SHARED memory, zeroed, inherited by forked children: the
// cheapest stand-in for a segment when a test only needs "shared memory".
class SharedRegion {
 public:
  explicit SharedRegion(size_t bytes);
  ~SharedRegion();
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;
  void* data() const { return data_; }
  size_t size() const { return bytes_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_;
  size_t bytes_;
};

}  // namespace kvrelay::testing

#include "shm/owner_lock.h"

namespace kvrelay::testing {

// Shared memory backed by a file (a memfd), so that owner locks work on it:
// every process (forked children included) takes its locks through its own
// open file description of the file, as processes attaching a segment do.
class SharedFileRegion {
 public:
  explicit SharedFileRegion(size_t bytes);
  ~SharedFileRegion();
  SharedFileRegion(const SharedFileRegion&) = delete;
  SharedFileRegion& operator=(const SharedFileRegion&) = delete;
  void* data() const { return data_; }
  size_t size() const { return bytes_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  // The lock space of the calling process (a description of its own,
  // opened on first use in each process).
  LockSpace locks();

 private:
  int fd_;
  void* data_;
  size_t bytes_;
  pid_t owner_pid_ = 0;
  int own_fd_ = -1;
};

}  // namespace kvrelay::testing

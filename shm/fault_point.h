// Named fault-injection points, compiled only into test builds
// (KVRELAY_FAULT_POINTS, on when BUILD_TESTING is): a place in the code where
// a test can make the process stop or die at one exact instruction, such as
// between a ring's claim and its commit.
//
//   KVRELAY_FAULT_POINT("mpsc.claimed");
//
// A process arms points through the environment, read once at start-up,
//
//   KVRELAY_FAULT=mpsc.claimed=kill              SIGKILL itself at the first hit
//   KVRELAY_FAULT=spsc.pushed=stop@3             SIGSTOP itself at the third hit
//   KVRELAY_FAULT=a=exit,b=kill                  several points
//
// or, in a forked test child, with fault::arm(). Actions: kill (SIGKILL),
// stop (SIGSTOP: the test continues it with SIGCONT), exit (_exit(86)).
// In other builds the macro is nothing at all.
#pragma once

#include <cstdint>
#include <string_view>

namespace kvrelay::fault {

enum class Action { kNone, kKill, kStop, kExit };

// Arms `name` to act at its `nth` hit (1 = the next one). Not thread-safe
// against concurrent hits: arm before the threads start.
void arm(std::string_view name, Action action, uint32_t nth = 1);
void disarm_all();
// Called by KVRELAY_FAULT_POINT; a single relaxed load when nothing is armed.
void hit(const char* name) noexcept;

}  // namespace kvrelay::fault

#ifdef KVRELAY_FAULT_POINTS
#define KVRELAY_FAULT_POINT(name) ::kvrelay::fault::hit(name)
#else
#define KVRELAY_FAULT_POINT(name) ((void)0)
#endif

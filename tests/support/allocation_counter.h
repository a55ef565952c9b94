// Counts every operator new of the process inside a window, for the tests
// that prove a hot path allocates nothing once warm (docs/latency.md).
//
// Link allocation_counter.cpp into the test binary itself (never into a
// library): it replaces the global operator new and delete.
#pragma once

#include <cstdint>

namespace kvrelay::testing {

void start_counting_allocations();
uint64_t stop_counting_allocations();  // the allocations since the start

// Counts the allocations of what runs inside it.
class AllocationWindow {
 public:
  AllocationWindow() { start_counting_allocations(); }
  ~AllocationWindow() { stop(); }
  AllocationWindow(const AllocationWindow&) = delete;
  AllocationWindow& operator=(const AllocationWindow&) = delete;
  // Stops counting (if still counting) and returns the count.
  uint64_t stop() {
    if (open_) {
      count_ = stop_counting_allocations();
      open_ = false;
    }
    return count_;
  }
  uint64_t count() { return stop(); }

 private:
  bool open_ = true;
  uint64_t count_ = 0;
};

}  // namespace kvrelay::testing

// A snapshot of everything kvrelay-dump shows about one instance, read from
// its control segment without writing to it or blocking on it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "instance/control_segment.h"
#include "shm/counters.h"

namespace kvrelay::dump {

struct HistogramView {
  std::string unit;
  uint64_t count = 0;
  uint64_t p50 = 0, p90 = 0, p99 = 0, p999 = 0, max = 0;  // within 1.6% (max: exact)
};

struct CountersView {
  std::vector<std::pair<std::string, uint64_t>> counters;  // in id order
  std::vector<std::pair<std::string, HistogramView>> histograms;
  uint64_t value(const std::string& label) const;
};

struct ProcessView {
  uint32_t pid = 0;
  std::string state;   // empty, starting, ready, exiting
  std::string health;  // absent, healthy, silent, dead
  double heartbeat_age_ms = 0;
  uint32_t registrations = 0;  // processes that have owned the slot (restarts + 1)
};

// Where one of a rank's pools is, as its directory entry says.
struct PoolEntryView {
  std::string tier;      // device, host
  std::string location;  // host-segment, cuda-ipc, cuda-vmm, host-fd; empty: none published
  std::string name;      // the segment's, or the registration's
  uint64_t bytes = 0;
  uint32_t device_id = 0;  // GPU locations
};

// A request the rank's watchdog found stalled (instance/request_stalls.h).
struct StallView {
  std::string request_id;
  uint32_t slot = 0;
  std::string reason;       // no_decode_half, transfers_in_flight, withdrawing
  std::string waiting_for;  // the reason, in words
  double seconds = 0;       // since its final chunk was signalled (or it ended)
  uint32_t in_flight = 0;
  std::string peer;
};

struct WorkerView {
  uint32_t rank = 0;
  ProcessView process;
  bool ready = false;  // the ready flag (the original's cache_ready_signal)
  // Why its worker is down, while it is ("" once a worker runs again):
  // "restarting after: " or "not restarted: " (its coordinator gave the rank
  // up), then how it ended and its own last words (instance/exit_reason.h).
  std::string exit_reason;
  CountersView counters;
  std::vector<PoolEntryView> pools;
  uint64_t device_signal_word = 0;  // layers the engine's GPU stream has signalled
  uint64_t doorbell_wakes = 0;      // FUTEX_WAKE calls made to wake this rank (its doorbell)
  uint64_t stalled = 0;             // requests stalled now (the first ones listed in stalls)
  std::vector<StallView> stalls;
};

struct RingView {
  std::string name;  // submit, completion, task[r], signal[r], report[r]
  std::string kind;  // mpsc (bytes) or spsc (records)
  uint64_t capacity = 0;
  uint64_t used = 0;
  uint64_t head = 0;  // consumer position (bytes or records)
  uint64_t tail = 0;  // producer position
  uint64_t full_events = 0;
  uint64_t skipped_records = 0;  // half-written records of dead producers given up
  uint64_t corrupt_records = 0;  // mpsc: defective records passed on or dropped
  uint64_t corrupt_events = 0;   // shared state found overwritten (and repaired where possible)
  uint64_t parked_waiters = 0;   // processes parked on the ring (consumer or producers)
  // ok; corrupt (records that cannot be delimited); impossible indices
  std::string state = "ok";
  double stalled_ms = 0;    // mpsc: how long a claim has blocked the consumer (0: not)
  int64_t stalled_by = -1;  // mpsc: the producer slot holding that claim, if alive
  // mpsc rings whose reader takes a lease (the completion ring): the live
  // reader's pid and session; 0 when none holds it.
  uint32_t reader_pid = 0;
  uint32_t reader_session = 0;
  // mpsc: the pid behind each producer slot held by a live process (on the
  // submit ring, one per attached engine client), and how many slots there are.
  std::vector<uint32_t> producer_pids;
  uint32_t producer_slots = 0;
};

struct BarrierView {
  uint32_t generation = 0;
  uint32_t parties = 0;
  uint32_t arrived = 0;
  uint64_t rounds_completed = 0;
  uint64_t rounds_poisoned = 0;
  uint64_t timeouts = 0;
};

struct InstanceView {
  // healthy, or unhealthy with `problems`: what stops requests from flowing.
  std::string health;
  std::vector<std::string> problems;
  std::string name;
  uint32_t layout_version = 0;
  uint64_t epoch = 0;
  std::string state;  // initialising, ready, draining, dead
  uint64_t segment_bytes = 0;
  bool stale = false;
  std::string stale_reason;
  ProcessView coordinator;
  uint64_t coordinator_doorbell_wakes = 0;  // FUTEX_WAKE calls made to wake the coordinator
  InstanceConfig config{};
  std::vector<WorkerView> workers;
  CountersView coordinator_counters;
  CountersView client_counters;  // shared by every client of the instance
  std::vector<RingView> rings;
  BarrierView barrier;
};

CountersView view_counters(const CountersBlock& block);
InstanceView snapshot(const ControlSegment& control);
// The instance's submit ring, whose live producers are its attached engine
// clients (nullptr if the view has none).
const RingView* submit_ring_of(const InstanceView& v);

}  // namespace kvrelay::dump

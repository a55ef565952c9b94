// The engine sessions the coordinator has heard from, and how each ended.
//
// Every Client attachment is a session: a producer slot of the submit ring,
// leased for the client's life (its owner lock proves it lives), and named
// by records::session_id(slot, generation). Its first record is a
// SessionHello. A session ends either cleanly (the client released its slot:
// its requests go on, their completions are still delivered) or by dying
// (its process is gone: its requests are withdrawn, nobody reads their
// completions). The coordinator learns which by polling the slots of the
// sessions it tracks, at most every 10 ms, and at once when a hello arrives
// (a restarted engine attaching is the moment stale requests must go).
//
// A hello is acknowledged (in the session's producer slot, which its client
// waits on) only after the coordinator has written the withdrawals of every
// dead session to the workers, and every live worker has read them: a
// restarted engine's first signals then reach each worker after them.
//
// Not thread-safe: the coordinator's loop owns it.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "shm/mpsc_ring.h"

namespace kvrelay::coordinator {

class EngineSessions {
 public:
  explicit EngineSessions(MpscRing submit) : submit_(std::move(submit)) {}

  // A record from (slot, generation) was read.
  void seen(uint32_t slot, uint16_t generation);
  // A hello from (slot, generation): acknowledged by acknowledge_pending().
  void hello(uint32_t slot, uint16_t generation);

  struct Ended {
    uint32_t session;  // records::session_id
    bool died;         // false: released cleanly
  };
  // Sessions found ended since the last call (at most every 10 ms, at once
  // with `force` or a hello pending).
  std::vector<Ended> poll(uint64_t now_ns, bool force = false);
  // Acknowledges the pending hellos. Call only once the withdrawals they
  // must follow are written.
  bool acknowledge_pending();
  bool hello_pending() const { return !pending_hellos_.empty(); }
  size_t tracked() const { return tracked_.size(); }

 private:
  MpscRing submit_;
  std::unordered_map<uint32_t, uint16_t> tracked_;  // slot -> generation
  std::vector<Ended> ended_;                        // found while recording new sessions
  std::vector<std::pair<uint32_t, uint16_t>> pending_hellos_;
  uint64_t next_poll_ns_ = 0;
};

}  // namespace kvrelay::coordinator

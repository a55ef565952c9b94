// A decode rank's expected requests over ipc. Over tcp the decode worker
// reads every byte itself, so it sees each write; over ipc the prefill
// worker writes this rank's pool directly, so the rank learns of the writes
// in two ways:
//
//   - before writing, the prefill worker checks this rank's claims (the
//     claim table in the control segment, shm/claim_table.h): a declared
//     request only into its blocks, nobody else into them, nobody for a
//     request that arrived or was withdrawn;
//   - after its copies completed, it says what landed on this rank's landed
//     ring (schema IpcLanded), and this class replays that into the rank's
//     Arrivals, which counts the request complete exactly as for tcp.
//
// A withdrawal (cancel, timeout) or a failure closes the request's claim and
// is answered only once no prefill worker can still be writing under it
// (settled()): writers announce the table's epoch while they write, and a
// writer that died is recognised by its free lease lock.
//
// Everything read from the ring is input from another process: every run
// is checked against the pool's shape before it counts.
//
// Not thread-safe: the worker's thread calls it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <unordered_map>

#include "instance/control_segment.h"
#include "instance/pool_geometry.h"
#include "shm/claim_table.h"
#include "shm/mpsc_ring.h"
#include "worker/arrivals.h"

namespace kvrelay::worker {

// Checks one IpcLanded record (its payload, read in place) against `pool`
// and counts what it says landed into `arrivals`: ok, or why the record was
// dropped whole. `landed_ns`, if given, gets the record's stamp (unchecked).
Status replay_landed(std::span<const std::byte> payload, const PoolGeometry& pool,
                     Arrivals& arrivals, uint64_t* landed_ns = nullptr);

class IpcReceiver {
 public:
  // The rank's claim table and landed ring in `control` (a decode instance's), taken over afresh:
  // claims of a previous worker of the rank are forgotten.
  static Result<std::unique_ptr<IpcReceiver>> open(const ControlSegment& control, uint32_t rank,
                                                 const PoolGeometry& pool,
                                                 std::shared_ptr<Arrivals> arrivals);

  // Claims `blocks` for the request (after Arrivals::expect accepted it).
  Status expect(uint64_t handle, uint64_t key, std::span<const uint32_t> blocks);
  // Ends the request's claim (arrived, failed, withdrawn); idempotent.
  void close(uint64_t handle);
  // Whether nothing can still land under the request's closed claim (true
  // for a request with no claim).
  bool settled(uint64_t handle) const;
  // Done with a closed request (answered).
  void forget(uint64_t handle) { close_epochs_.erase(handle); }

  // Replays what writers said landed into the Arrivals. Returns the records read.
  size_t drain(size_t max_records = 64);
  // Called with how long each record waited, from its writer's stamp to its
  // read (hop_landed_to_read); a stamp of 0 or from the future is not timed.
  void set_hop_observer(std::function<void(uint64_t ns)> observer) {
    hop_observer_ = std::move(observer);
  }
  bool readable() const { return ring_.readable(); }

 private:
  IpcReceiver(MpscRing ring, std::span<std::byte> table, uint32_t blocks, uint32_t rank,
            const PoolGeometry& pool, std::shared_ptr<Arrivals> arrivals);

  MpscRing ring_;
  ClaimOwner owner_;
  uint32_t rank_;
  PoolGeometry pool_;
  std::shared_ptr<Arrivals> arrivals_;
  std::unordered_map<uint64_t, uint64_t> keys_;          // handle -> key, claim open
  std::unordered_map<uint64_t, uint64_t> close_epochs_;  // handle -> epoch, closed unsettled
  std::function<void(uint64_t ns)> hop_observer_;
};

}  // namespace kvrelay::worker

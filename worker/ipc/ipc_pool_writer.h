// The prefill side of ipc into one decode rank (ipc_receiver.h is the decode
// side): a pool writer. The ipc transport asks it before it writes a layer into that rank's pool
// (admit), and tells it once the copies completed (landed); it checks the
// rank's claims and tells the rank what landed.
//
// It attaches the decode instance's control segment itself, so that writes
// still in flight keep the mapping they announce in, whatever the peer
// cache does meanwhile, and leases a producer slot on the rank's landed
// ring: the slot's owner lock is what proves to the decode rank that this
// writer is still alive while its announcement stands.
//
// A record the ring has no room for waits here, its announcement with it,
// and goes out on a later flush(); one that waited kGiveUpAfter is dropped
// (the decode rank's request then ends at its deadline).
//
// Not thread-safe: the worker's thread calls it.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "instance/control_segment.h"
#include "shm/claim_table.h"
#include "shm/mpsc_ring.h"
#include "worker/copy_plan.h"

namespace kvrelay::worker {

class IpcPoolWriter {
 public:
  static constexpr Nanos kGiveUpAfter = std::chrono::seconds(2);
  // Runs per record: well inside the ring's record limit.
  static constexpr size_t kRunsPerRecord = 1024;

  // Decode rank `rank` of the instance whose control segment `control` is
  // (shared: the writer keeps the mapping while it lives). kNotFound when
  // that instance has no claim table (it is not a decode instance).
  // `writer`: this (prefill) instance's name, carried by every record.
  static Result<std::shared_ptr<IpcPoolWriter>> open(
      std::shared_ptr<const ControlSegment> control, uint32_t rank, std::string writer = {});
  ~IpcPoolWriter();

  // Whether the decode rank's claims are in use: until its engine declares
  // a request, admit() and landed() need not be called.
  bool in_use() const { return view_.in_use(); }
  // Before writing `runs` of `layer` for the request named `key`: ok (then
  // landed() or abandon_last() must follow), or why the rank's claims refuse
  // it. A refusal that breaks a declared request's rule is told to the rank,
  // which fails that request.
  Status admit(uint64_t key, uint32_t layer, std::span<const BlockRun> runs);
  // The write admitted last never started.
  void abandon_last();
  // The oldest admitted write's copies completed (writes complete in the
  // order they were admitted).
  // `share`: heterogeneous TP, only these heads of each block were written.
  void landed(uint64_t key, uint32_t layer, std::span<const BlockRun> runs,
              const HeadShare* share = nullptr);
  // Sends what waited for room; true when nothing waits any more.
  bool flush();
  bool backlog() const { return !pending_.empty(); }

 private:
  struct Pending {
    std::vector<std::byte> record;
    bool releases_write;  // the last record of an admitted write
    uint64_t since_ns;
  };
  IpcPoolWriter(std::shared_ptr<const ControlSegment> control, MpscProducer producer,
                  ClaimWriterView view, uint32_t rank, std::string writer);
  void queue(uint64_t key, uint32_t layer, std::span<const BlockRun> runs, bool refused,
             bool releases_write, const HeadShare* share = nullptr);
  void announce_oldest();

  std::shared_ptr<const ControlSegment> control_;
  std::string writer_;
  MpscProducer producer_;
  ClaimWriterView view_;
  uint32_t rank_;
  std::deque<uint64_t> writes_;  // epochs the admitted writes read, oldest first
  std::deque<Pending> pending_;
  std::vector<uint64_t> scratch_;  // a record's first segment (capnp words, zeroed)
  bool sent_ = false;              // records went out since the last flush()
};

}  // namespace kvrelay::worker

// An in-process RC queue pair for the rdma posting logic's tests: writes are
// memcpy into memory "registered" under an rkey, checked against its bounds
// as a device would. It can hold completions back (a slow device: the send
// queue fills), refuse a chain part-way (a device with fewer slots than it
// said), fail a chosen write (an error completion; everything after it
// flushes, as RC does), and hand WRITE_WITH_IMM immediates to its peer's
// posted receives. It never drops or reorders what RC would not.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "worker/rdma/queue_pair.h"

namespace kvrelay::worker::rdma::testing {

class FakeQueuePair : public QueuePair {
 public:
  FakeQueuePair(std::string name, uint32_t max_send_wr)
      : name_(std::move(name)), max_(max_send_wr) {}

  // Remote memory this queue pair may write, under `rkey`.
  void register_remote(uint32_t rkey, std::byte* base, size_t bytes) {
    regions_[rkey] = {base, bytes};
  }
  void connect(FakeQueuePair* peer) { peer_ = peer; }

  // Test controls.
  bool hold_completions = false;       // writes execute, their completions wait
  uint32_t real_slots = 0;             // when nonzero, refuse posts past this many outstanding
  uint64_t fail_write_number = 0;      // the n-th write (1-based) completes with an error
  std::vector<size_t> chain_sizes;     // every post_writes call's length
  std::vector<WriteRequest> executed;  // every write, in order
  uint32_t outstanding() const { return outstanding_; }
  uint32_t peak_outstanding = 0;

  Result<size_t> post_writes(std::span<const WriteRequest> writes) override {
    chain_sizes.push_back(writes.size());
    const uint32_t limit = real_slots != 0 ? real_slots : max_;
    size_t accepted = 0;
    for (const WriteRequest& wr : writes) {
      if (outstanding_ >= limit) break;  // ENOMEM from here: bad_wr
      ++outstanding_;
      peak_outstanding = std::max(peak_outstanding, outstanding_);
      ++writes_seen_;
      executed.push_back(wr);
      bool ok = !in_error_;
      std::string status = in_error_ ? "work request flushed error" : "";
      if (ok && writes_seen_ == fail_write_number) {
        ok = false;
        status = "transport retry counter exceeded";
      }
      if (ok) ok = execute(wr, status);
      if (!ok) in_error_ = true;
      // In the error state every write completes (flushed), signaled or not.
      if (!ok || wr.signaled)
        queued_.push_back({wr.wr_id, ok, status, std::nullopt, wr.length});
      else
        unsignaled_.push_back(wr.wr_id);
      ++accepted;
    }
    return accepted;
  }

  Status post_receive(uint64_t wr_id) override {
    receives_.push_back(wr_id);
    return {};
  }

  size_t poll_send(std::span<WorkCompletion> out) override {
    if (hold_completions) return 0;
    size_t n = 0;
    // A completion frees its slot and those of the unsignaled writes before it.
    while (n < out.size() && !queued_.empty()) {
      const WorkCompletion wc = queued_.front();
      queued_.pop_front();
      while (!unsignaled_.empty() && unsignaled_.front() < wc.wr_id) {
        unsignaled_.pop_front();
        --outstanding_;
      }
      --outstanding_;
      out[n++] = wc;
    }
    return n;
  }

  size_t poll_receive(std::span<WorkCompletion> out) override {
    size_t n = 0;
    while (n < out.size() && !landed_.empty()) {
      out[n++] = landed_.front();
      landed_.pop_front();
    }
    return n;
  }

  uint32_t max_send_wr() const override { return max_; }
  std::string name() const override { return name_; }

 private:
  struct Region {
    std::byte* base;
    size_t bytes;
  };

  bool execute(const WriteRequest& wr, std::string& status) {
    auto it = regions_.find(wr.rkey);
    if (it == regions_.end() || wr.remote_address < reinterpret_cast<uint64_t>(it->second.base) ||
        wr.remote_address + wr.length >
            reinterpret_cast<uint64_t>(it->second.base) + it->second.bytes) {
      status = "remote access error";
      return false;
    }
    std::memcpy(reinterpret_cast<void*>(wr.remote_address),
                reinterpret_cast<const void*>(wr.local_address), wr.length);
    if (wr.immediate) {
      if (peer_ == nullptr || peer_->receives_.empty()) {
        status = "receiver not ready (RNR) retry counter exceeded";
        return false;
      }
      const uint64_t id = peer_->receives_.front();
      peer_->receives_.pop_front();
      peer_->landed_.push_back({id, true, "", wr.immediate, wr.length});
    }
    return true;
  }

  std::string name_;
  uint32_t max_;
  std::map<uint32_t, Region> regions_;
  FakeQueuePair* peer_ = nullptr;
  uint32_t outstanding_ = 0;
  uint64_t writes_seen_ = 0;
  bool in_error_ = false;
  std::deque<WorkCompletion> queued_;
  std::deque<uint64_t> unsignaled_;
  std::deque<uint64_t> receives_;
  std::deque<WorkCompletion> landed_;
};

}  // namespace kvrelay::worker::rdma::testing

// An in-process RDMA fabric for the rdma transport's tests: queue pairs of
// one process find each other by queue pair number, writes are memcpy into
// memory registered under an rkey (bounds checked as a device would), a
// WRITE_WITH_IMM consumes one of the peer's posted receives, and every
// completion makes the queue pair's eventfd readable. Both sides of a test
// share one FakeFabric (the sender's and the receiver's threads: everything
// is under one lock).
//
// Faults, as RC reports them: the n-th write fails ("transport retry counter
// exceeded") and every later one flushes; a write to a destroyed queue pair
// fails the same way; a write outside a registration is a "remote access
// error" (outside the local one, a "local protection error"). Nothing is
// dropped or reordered that RC would not. A dma-buf registration (GPU
// memory) is mapped and written there, as a NIC would.
//
// Memory windows (type 2), as a device that checks their ranges would have
// them: a registration made RemoteAccess::kWindowsOnly takes no remote write
// under its own key; a window's key takes writes only from the peer of the
// queue pair it was bound on, only inside its range, and none once
// invalidated or rebound. (Soft-RoCE does not check the range:
// docs/transports.md.)
#pragma once

#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "worker/rdma/fabric.h"

namespace kvrelay::worker::rdma::testing {

class FakeFabric;

class FakeRcQueuePair final : public RcQueuePair {
 public:
  FakeRcQueuePair(FakeFabric& fabric, uint32_t qpn);
  ~FakeRcQueuePair() override;

  const QpEndpoint& local() const override { return local_; }
  Status connect(const QpEndpoint& remote) override;
  int event_fd() const override { return event_fd_; }
  Status arm() override {
    uint64_t n = 0;
    while (::read(event_fd_, &n, sizeof n) == sizeof n) {
    }
    return {};
  }
  Result<size_t> post_writes(std::span<const WriteRequest> writes) override;
  Status post_bind(Window& window, const Registration& region, uint64_t address, uint64_t bytes,
                   uint64_t wr_id, bool signaled) override;
  Status post_invalidate(uint32_t rkey, uint64_t wr_id, bool signaled) override;
  Status post_receive(uint64_t wr_id) override;
  size_t poll_send(std::span<WorkCompletion> out) override;
  size_t poll_receive(std::span<WorkCompletion> out) override;
  uint32_t max_send_wr() const override { return kSlots; }
  std::string name() const override { return "fake qp " + std::to_string(local_.qpn); }

 private:
  friend class FakeFabric;
  static constexpr uint32_t kSlots = 64;
  void ring() {
    const uint64_t one = 1;
    (void)!::write(event_fd_, &one, sizeof one);
  }
  // Under the fabric's lock.
  bool execute(const WriteRequest& wr, std::string& status);
  // Takes a send-queue slot for a bind or an invalidation that did `ok`
  // (else failed with `status`), under the fabric's lock.
  Status complete_local(uint64_t wr_id, bool signaled, bool ok, const char* status);

  FakeFabric& fabric_;
  QpEndpoint local_;
  uint32_t peer_qpn_ = 0;
  int event_fd_;
  bool in_error_ = false;
  uint32_t outstanding_ = 0;
  std::deque<WorkCompletion> sent_;
  std::deque<uint64_t> unsignaled_;
  std::deque<uint64_t> receives_;
  std::deque<WorkCompletion> received_;
};

class FakeFabric final : public Fabric {
 public:
  struct FakeRegistration final : Registration {
    uint32_t key;
    std::shared_ptr<void> mapping;  // a dma-buf's pages
    uint32_t lkey() const override { return key; }
    uint32_t rkey() const override { return key; }
  };
  class FakeWindow final : public Window {
   public:
    explicit FakeWindow(FakeFabric& fabric) : fabric_(fabric) {}
    ~FakeWindow() override {
      std::lock_guard<std::mutex> lock(fabric_.mu);
      fabric_.windows_.erase(rkey_);
      --fabric_.live_windows;
    }
    uint32_t rkey() const override { return rkey_; }

   private:
    friend class FakeRcQueuePair;
    FakeFabric& fabric_;
    uint32_t rkey_ = 0;  // 0: never bound
  };

  Result<std::unique_ptr<Registration>> register_memory(void* address, size_t bytes,
                                                        RemoteAccess access) override {
    if (refuse_address_registrations)  // as ibv_reg_mr of GPU memory without nvidia-peermem
      return make_error(Errc::kSystem, "ibv_reg_mr: Bad address (errno 14)");
    std::lock_guard<std::mutex> lock(mu);
    auto r = std::make_unique<FakeRegistration>();
    r->key = next_key_++;
    regions_[r->key] = {static_cast<std::byte*>(address), bytes, static_cast<std::byte*>(address),
                        access == RemoteAccess::kWrite};
    ++registrations;
    return std::unique_ptr<Registration>(std::move(r));
  }
  // As a NIC would: the dma-buf's pages (here a memfd's), at [iova, iova +
  // bytes) in work requests.
  Result<std::unique_ptr<Registration>> register_dmabuf(int fd, uint64_t offset, size_t bytes,
                                                        uint64_t iova,
                                                        RemoteAccess access) override {
    const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    const uint64_t skip = offset % page;
    void* map = ::mmap(nullptr, bytes + skip, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                       static_cast<off_t>(offset - skip));
    if (map == MAP_FAILED) return make_error(Errc::kSystem, "fake fabric: cannot map the dma-buf");
    std::lock_guard<std::mutex> lock(mu);
    auto r = std::make_unique<FakeRegistration>();
    r->key = next_key_++;
    r->mapping = std::shared_ptr<void>(map, [n = bytes + skip](void* p) { ::munmap(p, n); });
    regions_[r->key] = {reinterpret_cast<std::byte*>(iova), bytes,
                        static_cast<std::byte*>(map) + skip, access == RemoteAccess::kWrite};
    ++registrations;
    ++dmabuf_registrations;
    return std::unique_ptr<Registration>(std::move(r));
  }
  Result<std::unique_ptr<RcQueuePair>> create_queue_pair() override {
    std::lock_guard<std::mutex> lock(mu);
    auto qp = std::make_unique<FakeRcQueuePair>(*this, next_qpn_++);
    qps_[qp->local().qpn] = qp.get();
    ++queue_pairs_created;
    return std::unique_ptr<RcQueuePair>(std::move(qp));
  }
  const std::string& name() const override { return name_; }
  Status windows_supported() const override {
    if (supports_windows) return {};
    return make_error(Errc::kUnsupported, "fake fabric: no memory windows (a test's setting)");
  }
  Result<std::unique_ptr<Window>> allocate_window() override {
    std::lock_guard<std::mutex> lock(mu);
    if (live_windows >= max_windows)
      return make_error(Errc::kSystem, "ibv_alloc_mw (type 2): Cannot allocate memory (errno 12)");
    ++live_windows;
    return std::unique_ptr<Window>(std::make_unique<FakeWindow>(*this));
  }

  // Test controls and observations.
  std::atomic<bool> supports_windows{true};
  std::atomic<uint32_t> max_windows{1u << 20};  // as a device's max_mw
  std::atomic<uint32_t> live_windows{0};
  std::atomic<uint64_t> binds{0};
  std::atomic<uint64_t> invalidations{0};
  std::atomic<uint64_t> fail_write_number{0};  // the n-th write overall fails (1-based)
  std::atomic<bool> refuse_address_registrations{false};
  std::atomic<uint64_t> writes{0};
  std::atomic<uint64_t> with_immediate{0};
  std::atomic<uint32_t> registrations{0};
  std::atomic<uint32_t> dmabuf_registrations{0};
  std::atomic<uint32_t> queue_pairs_created{0};
  size_t live_queue_pairs() {
    std::lock_guard<std::mutex> lock(mu);
    return qps_.size();
  }

  std::mutex mu;

 private:
  friend class FakeRcQueuePair;
  struct Region {
    std::byte* base;  // as work requests address it
    size_t bytes;
    std::byte* memory;  // where its bytes are (a dma-buf's mapping, or base)
    bool remote_write;  // by its own key (RemoteAccess::kWrite)
  };
  struct BoundWindow {
    uint32_t qpn;  // the queue pair it was bound on: only its peer writes through it
    uint32_t region;
    uint64_t address, bytes;
  };
  // Where the bytes of [address, + length) under `key` are; null when the
  // registration does not hold them.
  std::byte* locate(uint32_t key, uint64_t address, uint64_t length) {
    auto it = regions_.find(key);
    if (it == regions_.end()) return nullptr;
    const Region& r = it->second;
    const auto base = reinterpret_cast<uint64_t>(r.base);
    if (address < base || address + length > base + r.bytes) return nullptr;
    return r.memory + (address - base);
  }
  // The same for a remote write under `rkey` that arrives at queue pair
  // `at`: through a window bound there, or a registration that allows it.
  std::byte* locate_remote(uint32_t rkey, uint32_t at, uint64_t address, uint64_t length) {
    if (auto w = windows_.find(rkey); w != windows_.end()) {
      const BoundWindow& b = w->second;
      if (b.qpn != at || address < b.address || length > b.bytes ||
          address - b.address > b.bytes - length)
        return nullptr;
      return locate(b.region, address, length);
    }
    auto it = regions_.find(rkey);
    if (it == regions_.end() || !it->second.remote_write) return nullptr;
    return locate(rkey, address, length);
  }
  std::string name_ = "fake0 port 1";
  uint32_t next_key_ = 100;
  uint32_t next_qpn_ = 0x11;
  std::map<uint32_t, Region> regions_;
  std::map<uint32_t, BoundWindow> windows_;  // by current rkey
  std::map<uint32_t, FakeRcQueuePair*> qps_;
};

inline FakeRcQueuePair::FakeRcQueuePair(FakeFabric& fabric, uint32_t qpn)
    : fabric_(fabric), event_fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  local_.qpn = qpn;
  local_.psn = qpn * 3;
  local_.mtu = 4096;
  local_.gid[15] = 1;
}

inline FakeRcQueuePair::~FakeRcQueuePair() {
  {
    std::lock_guard<std::mutex> lock(fabric_.mu);
    fabric_.qps_.erase(local_.qpn);
  }
  ::close(event_fd_);
}

inline Status FakeRcQueuePair::connect(const QpEndpoint& remote) {
  std::lock_guard<std::mutex> lock(fabric_.mu);
  peer_qpn_ = remote.qpn;
  return {};
}

inline Status FakeRcQueuePair::post_receive(uint64_t wr_id) {
  std::lock_guard<std::mutex> lock(fabric_.mu);
  receives_.push_back(wr_id);
  return {};
}

inline bool FakeRcQueuePair::execute(const WriteRequest& wr, std::string& status) {
  const uint64_t n = ++fabric_.writes;
  if (n == fabric_.fail_write_number.load()) {
    status = "transport retry counter exceeded";
    return false;
  }
  auto peer = fabric_.qps_.find(peer_qpn_);
  if (peer == fabric_.qps_.end()) {
    status = "transport retry counter exceeded";  // nobody answers there any more
    return false;
  }
  // A zero-length write (an immediate alone) touches no memory: as on a
  // device, its keys are not checked.
  if (wr.length != 0) {
    std::byte* to = fabric_.locate_remote(wr.rkey, peer_qpn_, wr.remote_address, wr.length);
    if (to == nullptr) {
      status = "remote access error";
      return false;
    }
    const std::byte* from = fabric_.locate(wr.lkey, wr.local_address, wr.length);
    if (from == nullptr) {
      status = "local protection error";
      return false;
    }
    std::memcpy(to, from, wr.length);
  }
  if (wr.immediate) {
    FakeRcQueuePair& p = *peer->second;
    if (p.receives_.empty()) {
      status = "RNR retry counter exceeded";
      return false;
    }
    const uint64_t id = p.receives_.front();
    p.receives_.pop_front();
    p.received_.push_back({id, true, "", wr.immediate, wr.length});
    ++fabric_.with_immediate;
    p.ring();
  }
  return true;
}

inline Result<size_t> FakeRcQueuePair::post_writes(std::span<const WriteRequest> writes) {
  std::lock_guard<std::mutex> lock(fabric_.mu);
  size_t accepted = 0;
  for (const WriteRequest& wr : writes) {
    if (outstanding_ >= kSlots) break;  // ENOMEM from here
    ++outstanding_;
    std::string status = "work request flushed error";
    const bool ok = !in_error_ && execute(wr, status);
    if (!ok) in_error_ = true;
    if (!ok || wr.signaled)
      sent_.push_back({wr.wr_id, ok, ok ? "" : status, std::nullopt, wr.length});
    else
      unsignaled_.push_back(wr.wr_id);
    ++accepted;
  }
  if (!sent_.empty()) ring();
  return accepted;
}

inline Status FakeRcQueuePair::complete_local(uint64_t wr_id, bool signaled, bool ok,
                                              const char* status) {
  if (outstanding_ >= kSlots)
    return make_error(Errc::kSystem, "fake fabric: ibv_post_send: send queue full (errno 12)");
  ++outstanding_;
  if (in_error_) {
    ok = false;
    status = "work request flushed error";
  }
  if (!ok) in_error_ = true;
  if (!ok || signaled)
    sent_.push_back({wr_id, ok, ok ? "" : status, std::nullopt, 0});
  else
    unsignaled_.push_back(wr_id);
  if (!sent_.empty()) ring();
  return {};
}

inline Status FakeRcQueuePair::post_bind(Window& window, const Registration& region,
                                         uint64_t address, uint64_t bytes, uint64_t wr_id,
                                         bool signaled) {
  auto& w = static_cast<FakeFabric::FakeWindow&>(window);
  const uint32_t key = static_cast<const FakeFabric::FakeRegistration&>(region).key;
  std::lock_guard<std::mutex> lock(fabric_.mu);
  auto r = fabric_.regions_.find(key);
  const bool ok = !in_error_ && r != fabric_.regions_.end() && !r->second.remote_write &&
                  fabric_.locate(key, address, bytes) != nullptr;
  if (ok) {
    fabric_.windows_.erase(w.rkey_);
    w.rkey_ = fabric_.next_key_++;
    fabric_.windows_[w.rkey_] = {local_.qpn, key, address, bytes};
    ++fabric_.binds;
  }
  return complete_local(wr_id, signaled, ok, "memory bind operation error");
}

inline Status FakeRcQueuePair::post_invalidate(uint32_t rkey, uint64_t wr_id, bool signaled) {
  std::lock_guard<std::mutex> lock(fabric_.mu);
  auto w = fabric_.windows_.find(rkey);
  const bool ok = !in_error_ && w != fabric_.windows_.end() && w->second.qpn == local_.qpn;
  if (ok) {
    fabric_.windows_.erase(w);
    ++fabric_.invalidations;
  }
  return complete_local(wr_id, signaled, ok, "local protection error");
}

inline size_t FakeRcQueuePair::poll_send(std::span<WorkCompletion> out) {
  std::lock_guard<std::mutex> lock(fabric_.mu);
  size_t n = 0;
  while (n < out.size() && !sent_.empty()) {
    const WorkCompletion wc = sent_.front();
    sent_.pop_front();
    while (!unsignaled_.empty() && unsignaled_.front() < wc.wr_id) {
      unsignaled_.pop_front();
      --outstanding_;
    }
    --outstanding_;
    out[n++] = wc;
  }
  return n;
}

inline size_t FakeRcQueuePair::poll_receive(std::span<WorkCompletion> out) {
  std::lock_guard<std::mutex> lock(fabric_.mu);
  size_t n = 0;
  while (n < out.size() && !received_.empty()) {
    out[n++] = received_.front();
    received_.pop_front();
  }
  return n;
}

}  // namespace kvrelay::worker::rdma::testing

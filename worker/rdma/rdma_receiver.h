// The accepting side of the rdma transport (a decode-role worker). An rdma
// session rides on an authenticated connection of the rank's listener
// (net/listener.h; session_handler.h serves it): after the handshake the
// sender offers its queue
// pairs, and the session answers with as many of its own, connected to them,
// and where its pool's tensors are (registered once, shared by sessions).
//
// Writes are one-sided, so a write cannot be refused once it is on the wire.
// Before any write of a layer transfer the sender sends its intent (the
// destination blocks, and the queue pair its writes will take); the session
// checks every block against the pool and the rank's expected requests
// (Arrivals::admit) and grants or refuses it. A grant carries, per run and
// tensor, the key the sender writes that run with (grant_keys()).
// The transfer's last write carries an immediate; its receive completion
// means, by RC ordering, that every write of the transfer has landed: the
// writes count as landed (Arrivals::landed) and the sender gets its ack.
//
// A session that ends (the connection closed, a completion failed, the peer
// broke the protocol) destroys its queue pairs first, so that no further
// byte can land, and only then abandons what was granted and did not land.
//
// Windows: where the device binds type-2 memory windows (the pool is then
// registered for windows only, registered_pool.h), a grant's keys are
// windows bound for it on the queue pair its intent named: one per tensor
// for each group of its runs (every run its own, up to kWindowGroups runs; a
// longer intent's runs share windows that span from a group's first block
// to its last). The grant is sent once the binds completed; at landing the
// windows are invalidated before the writes count as landed and are acked,
// so no byte of that peer lands afterwards. A peer writes nothing outside
// an open grant of its own session, then; inside a window's range only on a
// device that checks ranges (soft-RoCE does not: docs/transports.md). A
// session holds at most max_windows; a grant that finds none free waits for
// landings to return some.
//
// Without windows, the keys granted are the pool registration's, so the
// pool's memory is writable remotely by the peers that hold the net key, as
// an ipc writer on the host maps it; a write that lands without a grant is
// caught only when it carries an immediate (which names no granted
// transfer: the session is closed).
//
// Not thread-safe: each session lives on its connection's strand.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "worker/arrivals.h"
#include "worker/local_pool.h"
#include "worker/rdma/control_wire.h"
#include "worker/rdma/fabric.h"
#include "worker/rdma/registered_pool.h"
#include "worker/rdma/window_work.h"

namespace kvrelay::worker::rdma {

// What the sessions of one listener share.
class RdmaListener {
 public:
  // `fabric` null: rdma offers are refused with `why_not`. `registered`:
  // the pool's registration on `fabric`, made up front; null, and the first
  // session makes it.
  RdmaListener(Fabric* fabric, std::string why_not, const LocalPool& pool, uint32_t rank,
               std::shared_ptr<const RegisteredPool> registered = nullptr)
      : fabric_(fabric),
        why_not_(std::move(why_not)),
        pool_(pool),
        rank_(rank),
        registration_(std::move(registered)) {}
  Fabric* fabric() const { return fabric_; }
  const std::string& why_not() const { return why_not_; }
  const LocalPool& pool() const { return pool_; }
  uint32_t rank() const { return rank_; }
  // The pool's registration, made by the first session that needs it if it
  // was not given.
  Result<std::shared_ptr<const RegisteredPool>> registration();

  // Bytes a session may hold granted and not landed; a transfer that would
  // pass it is refused, naming the limit.
  static constexpr uint64_t kMaxGrantedBytes = 4ull << 30;
  uint64_t max_granted_bytes = kMaxGrantedBytes;  // tests set less
  // Memory windows a session may hold (bound or spare). Soft-RoCE on Linux
  // 6.1 has 4,096 for the whole device.
  static constexpr size_t kMaxWindows = 512;
  size_t max_windows = kMaxWindows;  // tests set less
  // Tests only: plays a hostile receiver by altering each grant message's
  // parts before they are sent.
  std::function<void(std::vector<Grant>&)> tamper_grants;

 private:
  Fabric* fabric_;
  std::string why_not_;
  const LocalPool& pool_;
  uint32_t rank_;
  std::mutex mu_;
  std::shared_ptr<const RegisteredPool> registration_;
};

struct Ack {
  uint64_t transfer;
  Status status;
};

class RdmaSession {
 public:
  // Creates and connects a queue pair for each offered one.
  static Result<std::unique_ptr<RdmaSession>> accept(RdmaListener& listener, Arrivals& arrivals,
                                                     std::span<const QpEndpoint> offer,
                                                     std::string peer, std::string sender);
  ~RdmaSession();
  RdmaSession(const RdmaSession&) = delete;
  RdmaSession& operator=(const RdmaSession&) = delete;

  // For the RdmaAccept.
  std::vector<QpEndpoint> endpoints() const;
  const RegisteredPool& registration() const { return *registration_; }
  std::vector<int> event_fds() const;

  // One part of an intent. After the last part: the grant to send, a part
  // for each part of the intent, or one part refusing it (with nothing of it
  // admitted); nothing where its windows are being bound (poll() hands the
  // grant out once they are), or refusals of transfers (this one or waiting
  // ones) for which no window could be had, with the grant of this one if it
  // has no runs. An error: the peer broke the protocol (close
  // the connection).
  Result<std::optional<std::vector<Grant>>> on_intent(const Intent& part);
  // Arms the queue pairs and drains their completions: appends an ack for
  // every transfer that landed, and the grant of every transfer whose
  // windows were bound (its parts, in order). An error: the session is
  // broken.
  Status poll(std::vector<Ack>& acks, std::vector<Grant>& grants);
  // Windows this session holds (bound or spare).
  size_t windows_held() const { return windows_held_; }
  // Runs that get windows of their own; more share them (see above).
  static constexpr size_t kWindowGroups = 16;

  uint64_t bytes_landed() const { return bytes_landed_; }
  size_t open_transfers() const { return transfers_.size(); }
  // Why the session must end now, or nothing: a granted transfer whose
  // request was withdrawn meanwhile, or the oldest granted transfer, whose
  // writes have not landed within `grace` plus a second per
  // kMinRateBytesPerSecond of its own bytes, counted from its grant or from
  // the last transfer that landed, whichever is later. So a peer that holds
  // a grant cannot hold a withdrawal, or the rank, hostage, and a peer whose
  // writes keep landing is never cut, however long its backlog (a long
  // prompt's layers) and however slow its link (a contended host).
  std::optional<std::string> overdue(std::chrono::milliseconds grace) const;

 private:
  enum class Stage {
    kAsked,         // intent parts arriving
    kAwaitingWindows,  // asked in full and admitted; no windows free yet
    kBinding,       // its windows' binds posted
    kGranted,       // the grant sent: its writes may land
    kInvalidating,  // landed; its windows' invalidations posted
  };
  struct Granted {
    uint64_t transfer = 0;
    std::vector<LandedWrite> writes;  // admitted
    uint64_t bytes = 0;
    uint64_t runs = 0;    // over its parts so far
    std::string refused;  // why, once a part was refused
    Stage stage = Stage::kAsked;
    uint32_t layer = 0;
    uint32_t queue_pair = 0;          // the intent's
    std::vector<size_t> part_runs;    // runs per part, until the grant
    std::vector<BlockSpan> run_spans;  // every part's runs, until the grant (windows only)
    std::vector<std::unique_ptr<Window>> windows;  // group-major, then tensor
    std::chrono::steady_clock::time_point granted_at{};
  };
  RdmaSession(RdmaListener& listener, Arrivals& arrivals, std::string peer)
      : listener_(listener), arrivals_(arrivals), peer_(std::move(peer)) {}
  // Admits one write of a transfer, or records why the transfer is refused.
  void admit(Granted& g, const LandedWrite& w);
  void abandon(Granted& g);
  // The grant's parts: a key per run and tensor, the window bound for the
  // run's group, or (no windows) the pool registration's key of the tensor.
  std::vector<Grant> grant_keys(const Granted& g) const;
  // Windows `g` needs, and what each one spans.
  std::vector<WindowWork::Bind> window_spans(const Granted& g) const;
  // Gives waiting transfers their windows and posts their binds, in order
  // of asking, while windows can be had. Appended to `answers`: the refusal
  // of one that can get none (the device has no more, and this session
  // holds none in use), and the grant of one with no runs (nothing to bind).
  // An error: the session is broken.
  Status bind_waiting(std::vector<Grant>& answers);
  // Every write of `g` landed and (with windows) its windows are invalid:
  // the writes count, the sender gets its ack, the windows are spare.
  void land(uint32_t imm, std::vector<Ack>& acks);

  RdmaListener& listener_;
  Arrivals& arrivals_;
  std::string peer_;
  std::string sender_;  // the peer's instance (its authenticated hello): whose writes these are
  std::shared_ptr<const RegisteredPool> registration_;
  std::vector<std::unique_ptr<RcQueuePair>> queue_pairs_;
  std::vector<std::unique_ptr<WindowWork>> window_work_;  // per queue pair (windows only)
  std::vector<std::unique_ptr<Window>> spare_windows_;
  size_t windows_held_ = 0;              // bound and spare
  std::deque<uint32_t> awaiting_windows_;  // immediates, in order of asking
  std::vector<uint32_t> finished_;       // scratch
  std::unordered_map<uint32_t, Granted> transfers_;  // by immediate (the transfer's low 32 bits)
  uint64_t bytes_landed_ = 0;
  std::chrono::steady_clock::time_point last_landed_{};  // when a transfer last landed
  uint64_t granted_open_bytes_ = 0;  // granted transfers' bytes not landed yet
  size_t open_writes_ = 0;           // admitted writes of open transfers
};

// The immediate that names transfer `transfer` on the wire.
inline uint32_t immediate_of(uint64_t transfer) { return static_cast<uint32_t>(transfer); }

}  // namespace kvrelay::worker::rdma

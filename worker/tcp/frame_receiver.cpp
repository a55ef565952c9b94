#include "worker/tcp/frame_receiver.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <deque>
#include <mutex>
#include <optional>
#include <unordered_set>

#include "worker/tcp/frame_wire.h"

namespace kvrelay::worker::tcp {

namespace asio = boost::asio;

namespace {

// A peer may hold this many refused transfers open (their last frame not yet
// read) and leave this many messages to it unread, before it is closed.
constexpr size_t kMaxRefusedOpen = 4096;
constexpr size_t kMaxQueuedReplies = 4096;
// A refused frame larger than this is not read to be dropped: the stream closes.
constexpr uint64_t kMaxDrop = 1ull << 32;
constexpr auto kWarnEvery = std::chrono::seconds(10);
// How often an arriving payload is looked at (its deadline, its request).
constexpr auto kWatchEvery = std::chrono::milliseconds(100);

// `sender`: the connection's authenticated instance.
LandedWrite landed_write(const FrameHeader& f, std::string_view sender) {
  return LandedWrite{f.request_key, f.layer, f.tensor, f.dst_offset, f.bytes, sender};
}

// What the handlers of one listener share.
struct Shared {
  FrameReceiverOptions options;
  std::shared_ptr<FrameStats> stats;
  std::mutex warn_mu;
  std::chrono::steady_clock::time_point warned_at{};
  uint64_t unwarned = 0;

  void warn_refused(const std::string& peer, uint64_t transfer, const std::string& why) {
    std::lock_guard lock(warn_mu);
    const auto now = std::chrono::steady_clock::now();
    if (now - warned_at < kWarnEvery) {
      ++unwarned;
      return;
    }
    spdlog::warn("rank {}: refused a frame from {} (transfer {}): {}{}", options.rank, peer,
                 transfer, why,
                 unwarned != 0 ? fmt::format(" ({} more refusals since the last warning)", unwarned)
                               : std::string());
    warned_at = now;
    unwarned = 0;
  }
};

class FrameReceiver final : public net::MessageHandler {
 public:
  FrameReceiver(net::ServerLink& link, std::shared_ptr<Shared> shared, bool at_handshake)
      : link_(link), shared_(std::move(shared)), payload_deadline_(link.executor()) {
    if (at_handshake && staged() && shared_->options.stager) {
      // Before the helloAck: a sender that hears it (a ConnectTask) finds
      // them made. Should it fail, the first frame is refused saying why.
      if (Status s = ensure_slots(); !s)
        spdlog::warn("rank {}: {}: no staging memory yet: {}", shared_->options.rank,
                     link_.peer_name(), s.error().message);
    }
  }

  void on_message(const net::Inbound& in) override {
    Result<Message> m = decode(in);
    if (!m) return link_.close(m.error().message);
    if (m->kind != Message::Kind::kFrame) return link_.close("a tcp ack sent to a receiver");
    on_frame(m->frame);
  }

  void on_closed(const std::string&) override {
    unwatch();
    if (payload_in_progress_) arrivals().abandoned(landed_write(*payload_in_progress_, sender()));
    resume_ = nullptr;
    settle_staged();  // what has no copy in flight; the rest as its copies end
  }

 private:
  std::string_view sender() const { return link_.hello().instance; }
  const LocalPool& pool() const { return *shared_->options.pool; }
  Arrivals& arrivals() { return *shared_->options.arrivals; }
  bool staged() const { return pool().memory_kind() != kernels::MemoryKind::kHost; }

  void on_frame(const FrameHeader& f) {
    auto after = [this, f] {
      if (f.last) finish_transfer(f.transfer);
      link_.read_next();
    };
    // A refused transfer's later frames are dropped unanswered (it was
    // answered once).
    if (refused_.count(f.transfer) != 0) return drop(f, [this] { link_.read_next(); });
    Status ok = check_frame(f, pool().geometry());
    if (ok && staged()) ok = ensure_slots();
    std::byte* base = ok ? pool().tensor(f.layer, static_cast<PoolTensor>(f.tensor)) : nullptr;
    if (ok && base == nullptr)
      ok = make_error(Errc::kInvalidArgument,
                      fmt::format("layer {} tensor {} does not exist", f.layer, f.tensor));
    if (ok) ok = arrivals().admit(landed_write(f, sender()));  // the declared requests' blocks
    if (!ok) {
      ++shared_->stats->refused_frames;
      shared_->warn_refused(link_.peer_name(), f.transfer, ok.error().message);
      if (refused_.size() >= kMaxRefusedOpen)
        return link_.close(
            fmt::format("{} refused transfers left open by the peer", refused_.size()));
      if (!f.last) refused_.insert(f.transfer);  // its later frames are dropped unanswered
      reply(f.transfer, false, ok.error().message);
      return drop(f, [this] { link_.read_next(); });
    }
    ++shared_->stats->frames;
    shared_->stats->bytes += f.bytes;
    watch_payload(f);
    if (staged()) {
      staged_.push_back(StagedFrame{f});
      return read_staged(base + f.dst_offset, f.bytes, /*first=*/true);
    }
    payload_in_progress_ = f;  // until it has landed: a close meanwhile abandons it
    auto keep = link_.keep_alive();
    link_.read_payload(base + f.dst_offset, f.bytes, [this, keep, f, after] {
      payload_in_progress_.reset();
      unwatch();
      arrivals().landed(landed_write(f, sender()));
      after();
    });
  }

  // An admitted payload that stops coming, or whose request is withdrawn
  // while it comes, is abandoned with its connection: no peer holds a
  // withdrawal (or the rank) hostage by trickling bytes.
  void watch_payload(const FrameHeader& f) {
    const auto allowed =
        shared_->options.payload_grace + std::chrono::milliseconds(f.bytes / (1u << 20) * 1000);
    watched_ = f;
    watch_until_ = std::chrono::steady_clock::now() + allowed;
    watch_allowed_ = allowed;
    arm_watch();
  }
  void arm_watch() {
    payload_deadline_.expires_after(kWatchEvery);
    payload_deadline_.async_wait(
        [this, keep = link_.keep_alive()](const boost::system::error_code& ec) {
          if (ec || link_.closed() || !watched_) return;
          const FrameHeader& f = *watched_;
          if (f.request_key != 0 && arrivals().withdrawing(f.request_key))
            return link_.close(
                fmt::format("its request was withdrawn while the payload of a frame "
                            "(transfer {}, layer {}, {} bytes) was arriving",
                            f.transfer, f.layer, f.bytes));
          if (std::chrono::steady_clock::now() >= watch_until_)
            return link_.close(
                fmt::format("the payload of a frame (transfer {}, layer {}, {} "
                            "bytes) did not arrive within {} ms",
                            f.transfer, f.layer, f.bytes, watch_allowed_.count()));
          arm_watch();
        });
  }
  void unwatch() {
    watched_.reset();
    payload_deadline_.cancel();
  }

  void reply(uint64_t transfer, bool ok, const std::string& reason) {
    if (link_.queued() >= kMaxQueuedReplies)
      return link_.close(fmt::format("{} replies left unread by the peer", link_.queued()));
    net::Outgoing out;
    encode_ack(transfer, ok, reason, out.owned);
    link_.send(std::move(out));
  }

  // A GPU pool's connection: its staging slots, made once.
  Status ensure_slots() {
    if (slots_) return {};
    const std::shared_ptr<Stager>& stager = shared_->options.stager;
    if (!stager)
      return make_error(
          Errc::kUnsupported,
          fmt::format("rank {}'s pool is {} GPU memory and its tcp listener has no "
                      "staging for it",
                      shared_->options.rank, kernels::memory_kind_name(pool().memory_kind())));
    Result<std::unique_ptr<StagingSlots>> slots =
        stager->make_slots(largest_block_bytes(pool().geometry()));
    if (!slots) return slots.error();
    slots_ = std::move(slots).value();
    return {};
  }

  // Reads the rest of the newest frame's payload (`left` bytes, bound for
  // `dst` in GPU memory) a slot at a time, each slot copied host->device on
  // the stager's thread; waits for a free slot when none is (the stream is
  // not read meanwhile).
  void read_staged(std::byte* dst, uint64_t left, bool first) {
    const int slot = slots_->take();
    if (slot < 0) {
      resume_ = [this, dst, left, first] { read_staged(dst, left, first); };
      return;
    }
    const uint64_t n = std::min(left, slots_->slot_bytes());
    auto keep = link_.keep_alive();
    link_.read_payload(
        slots_->slot(slot), n,
        [this, keep, slot, dst, n, left] {
          StagedFrame& newest = staged_.back();
          ++newest.copies_in_flight;
          newest.read = n == left;
          if (newest.read) unwatch();
          shared_->options.stager->copy(
              Stager::Direction::kToDevice, {StagedCopy{slots_->slot(slot), dst, n}},
              [this, keep, slot](Status copied) mutable {
                // The connection's last reference must not end on the stager's
                // thread: it may hold the stager itself.
                auto strand = link_.executor();
                asio::post(strand, [this, keep = std::move(keep), slot,
                                    copied = std::move(copied)] { on_staged_copy(slot, copied); });
              });
          if (n < left) return read_staged(dst + n, left - n, /*first=*/false);
          link_.read_next();
        },
        first, /*last=*/n == left);
  }

  // A slot's host->device copy ended. Copies end in the order they were
  // queued: it is the oldest frame's with copies in flight.
  void on_staged_copy(int slot, const Status& copied) {
    slots_->give_back(slot);
    uint64_t transfer = 0;
    for (StagedFrame& f : staged_) {
      if (f.copies_in_flight == 0) continue;
      --f.copies_in_flight;
      if (!copied) f.failed = true;
      transfer = f.header.transfer;
      break;
    }
    // Sticky (a CUDA fault): the transfer hears why, then the connection
    // closes (its other transfers fail) and nothing more lands through it.
    if (!copied && !link_.closed() && !failing_) {
      failing_ = true;
      spdlog::error("rank {}: {}; closing the connection from {}", shared_->options.rank,
                    copied.error().message, link_.peer_name());
      refused_.insert(transfer);
      net::Outgoing nack;
      encode_ack(transfer, false, copied.error().message, nack.owned);
      nack.written = [this, keep = link_.keep_alive(), why = copied.error().message] {
        link_.close(why);
      };
      link_.send(std::move(nack));
    }
    settle_staged();
    if (resume_ && !link_.closed() && !failing_) std::exchange(resume_, nullptr)();
  }

  // Frames whose copies have all ended count, oldest first: landed (and a
  // transfer's last one acks it), or, when a copy failed or the connection
  // closed before the payload was all read, abandoned. Never while a copy
  // of the frame may still write into the pool.
  void settle_staged() {
    while (!staged_.empty()) {
      const StagedFrame& f = staged_.front();
      if (f.copies_in_flight > 0 || (!f.read && !link_.closed())) return;
      const FrameHeader header = f.header;
      const bool landed = f.read && !f.failed;
      staged_.pop_front();
      if (!landed) {
        arrivals().abandoned(landed_write(header, sender()));
        continue;
      }
      arrivals().landed(landed_write(header, sender()));
      if (header.last && !link_.closed()) finish_transfer(header.transfer);
    }
  }

  // A refused frame's payload is read and dropped, unless it is too large
  // to be one of ours: then the stream is closed.
  void drop(const FrameHeader& f, std::function<void()> after) {
    if (f.bytes > kMaxDrop)
      return link_.close(
          fmt::format("a refused frame of {} bytes; closing rather than reading it", f.bytes));
    if (f.last) refused_.erase(f.transfer);
    link_.discard_payload(f.bytes, std::move(after));
  }

  void finish_transfer(uint64_t transfer) {
    if (refused_.erase(transfer) != 0) return;  // already answered
    Status intact = pool().check_intact();
    reply(transfer, intact.ok(), intact ? "" : intact.error().message);
  }

  net::ServerLink& link_;
  std::shared_ptr<Shared> shared_;
  asio::steady_timer payload_deadline_;
  std::optional<FrameHeader> watched_;  // the payload arriving now
  std::chrono::steady_clock::time_point watch_until_;
  std::chrono::milliseconds watch_allowed_{0};
  bool failing_ = false;
  std::unordered_set<uint64_t> refused_;            // transfers refused, until their last frame
  std::optional<FrameHeader> payload_in_progress_;  // admitted, its payload being read
  // A GPU pool's: admitted frames not yet settled, oldest first.
  struct StagedFrame {
    FrameHeader header;
    uint32_t copies_in_flight = 0;
    bool read = false;    // all of its payload is in slots or on the device
    bool failed = false;  // a copy of it failed
  };
  std::deque<StagedFrame> staged_;
  std::unique_ptr<StagingSlots> slots_;
  std::function<void()> resume_;  // the read that waits for a free slot
};

}  // namespace

net::HandlerFactory frame_receiver(FrameReceiverOptions options, std::shared_ptr<FrameStats> stats,
                                   bool at_handshake) {
  auto shared = std::make_shared<Shared>();
  shared->options = std::move(options);
  shared->stats = std::move(stats);
  net::HandlerFactory f;
  f.protocol = kProtocol;
  f.name = "tcp frames";
  f.at_handshake = at_handshake;
  f.make = [shared, at_handshake](net::ServerLink& link) -> std::unique_ptr<net::MessageHandler> {
    return std::make_unique<FrameReceiver>(link, shared, at_handshake);
  };
  return f;
}

}  // namespace kvrelay::worker::tcp

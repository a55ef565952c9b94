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
    on_frame(m->frame, frame_parts(m->frame, m->runs));
  }

  void on_closed(const std::string&) override {
    unwatch();
    for (const FrameHeader& part : payload_in_progress_)
      arrivals().abandoned(landed_write(part, sender()));
    resume_ = nullptr;
    settle_staged();  // what has no copy in flight; the rest as its copies end
  }

 private:
  std::string_view sender() const { return link_.hello().instance; }
  const LocalPool& pool() const { return *shared_->options.pool; }
  Arrivals& arrivals() { return *shared_->options.arrivals; }
  bool staged() const { return pool().memory_kind() != kernels::MemoryKind::kHost; }

  // Where each part lands, once all of them passed their checks and were
  // admitted; else why not (the parts admitted so far are abandoned).
  Status admit_parts(const std::vector<FrameHeader>& parts) {
    if (staged())
      if (Status s = ensure_slots(); !s) return s;
    landing_.clear();
    for (size_t i = 0; i < parts.size(); ++i) {
      const FrameHeader& part = parts[i];
      Status ok = check_frame(part, pool().geometry());
      std::byte* base =
          ok ? pool().tensor(part.layer, static_cast<PoolTensor>(part.tensor)) : nullptr;
      if (ok && base == nullptr)
        ok = make_error(Errc::kInvalidArgument,
                        fmt::format("layer {} tensor {} does not exist", part.layer, part.tensor));
      if (ok) ok = arrivals().admit(landed_write(part, sender()));  // the declared requests' blocks
      if (!ok) {
        for (size_t j = 0; j < i; ++j)
          arrivals().abandoned(landed_write(parts[j], sender()));
        if (parts.size() == 1) return ok;
        return make_error(ok.error().code,
                          fmt::format("run {} of {}: {}", i, parts.size(), ok.error().message));
      }
      landing_.push_back(iovec{base + part.dst_offset, part.bytes});
    }
    return {};
  }

  // `f`: the frame as sent; `parts`: its runs, each as a frame of its own.
  void on_frame(const FrameHeader& f, std::vector<FrameHeader> parts) {
    // A refused transfer's later frames are dropped unanswered (it was
    // answered once).
    if (refused_.count(f.transfer) != 0) return drop(f, [this] { link_.read_next(); });
    if (Status ok = admit_parts(parts); !ok) {
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
      for (const FrameHeader& part : parts)
        staged_.push_back(StagedFrame{part});
      staged_cursor_ = StagedCursor{};
      return read_staged(/*first=*/true);
    }
    // Until it has all landed and its tag is checked: a close meanwhile abandons it.
    payload_in_progress_ = std::move(parts);
    link_.read_scattered(landing_,
                         [this, keep = link_.keep_alive(), last = f.last, transfer = f.transfer] {
                           unwatch();
                           for (const FrameHeader& part : payload_in_progress_)
                             arrivals().landed(landed_write(part, sender()));
                           payload_in_progress_.clear();
                           if (last) finish_transfer(transfer);
                           link_.read_next();
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

  // Reads the newest frame's payload (its parts: the last landing_.size()
  // entries of staged_, bound for GPU memory) a slot at a time, each slot
  // filled with the payload's next bytes across parts and copied
  // host->device on the stager's thread; waits for a free slot when none is
  // (the stream is not read meanwhile).
  void read_staged(bool first) {
    const int slot = slots_->take();
    if (slot < 0) {
      resume_ = [this, first] { read_staged(first); };
      return;
    }
    std::byte* const base = slots_->slot(slot);
    const size_t group = landing_.size();
    std::vector<StagedCopy> copies;
    const size_t first_part = staged_cursor_.part;  // in the group
    uint64_t used = 0;
    while (used < slots_->slot_bytes() && staged_cursor_.part < group) {
      const iovec& part = landing_[staged_cursor_.part];
      const uint64_t n =
          std::min<uint64_t>(part.iov_len - staged_cursor_.done, slots_->slot_bytes() - used);
      copies.push_back(
          StagedCopy{base + used, static_cast<std::byte*>(part.iov_base) + staged_cursor_.done, n});
      used += n;
      staged_cursor_.done += n;
      if (staged_cursor_.done == part.iov_len) staged_cursor_ = {staged_cursor_.part + 1, 0};
    }
    const bool last = staged_cursor_.part == group;
    auto keep = link_.keep_alive();
    link_.read_payload(
        base, used,
        [this, keep, slot, last, group, first_part, copies = std::move(copies)]() mutable {
          // The parts with a piece in this slot: one copy in flight each.
          // The group is the newest entries of staged_ (older ones may have
          // settled meanwhile, from the front).
          const size_t parts = copies.size();
          for (size_t i = 0; i < parts; ++i)
            ++staged_[staged_.size() - group + first_part + i].copies_in_flight;
          if (last) {  // all of it read, and its tag checked: it counts once its copies end
            for (size_t i = staged_.size() - group; i < staged_.size(); ++i)
              staged_[i].read = true;
            unwatch();
          }
          shared_->options.stager->copy(Stager::Direction::kToDevice, std::move(copies),
                                        [this, keep, slot, parts](Status copied) mutable {
                                          // The connection's last reference must not end on the
                                          // stager's thread: it may hold the stager itself.
                                          auto strand = link_.executor();
                                          asio::post(strand, [this, keep = std::move(keep), slot,
                                                              parts, copied = std::move(copied)] {
                                            on_staged_copy(slot, parts, copied);
                                          });
                                        });
          if (!last) return read_staged(/*first=*/false);
          link_.read_next();
        },
        first, last);
  }

  // A slot's host->device copy ended, for `parts` frames. Copies end in the
  // order they were queued: they are the oldest frames with copies in flight.
  void on_staged_copy(int slot, size_t parts, const Status& copied) {
    slots_->give_back(slot);
    uint64_t transfer = 0;
    for (StagedFrame& f : staged_) {
      if (parts == 0) break;
      if (f.copies_in_flight == 0) continue;
      --f.copies_in_flight;
      if (!copied) f.failed = true;
      if (transfer == 0) transfer = f.header.transfer;
      --parts;
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
  // The frame being read: where its parts land, and (a host pool) the parts,
  // admitted, until their payload has landed.
  std::vector<iovec> landing_;
  std::vector<FrameHeader> payload_in_progress_;
  struct StagedCursor {
    size_t part = 0;    // of landing_
    uint64_t done = 0;  // of that part's bytes, in slots
  } staged_cursor_;
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

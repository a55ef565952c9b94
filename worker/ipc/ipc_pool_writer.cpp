#include "worker/ipc/ipc_pool_writer.h"

#include <capnp/message.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "schemas/codec.h"
#include "shm/clock.h"
#include "shm/futex.h"

namespace kvrelay::worker {

Result<std::shared_ptr<IpcPoolWriter>> IpcPoolWriter::open(
    std::shared_ptr<const ControlSegment> owned, uint32_t rank, std::string writer) {
  Result<MpscRing> ring = owned->landed_ring(rank);
  if (!ring) return ring.error();
  const uint32_t blocks = claim_table_blocks(owned->config());
  std::span<std::byte> table = owned->claim_table(rank);
  if (table.size() < claim_table_bytes(blocks))
    return make_error(Errc::kCorrupt, fmt::format("decode rank {}'s claim table is {} bytes, "
                                                  "not {}",
                                                  rank, table.size(), claim_table_bytes(blocks)));
  Result<MpscProducer> producer = ring->lease_producer();
  if (!producer)
    return make_error(producer.code(), fmt::format("decode rank {}'s landed ring: {}", rank,
                                                   producer.error().message));
  ClaimWriterView view(table, blocks, producer->slot());
  view.set_announcement(0);  // whatever a dead predecessor in this slot left
  return std::shared_ptr<IpcPoolWriter>(new IpcPoolWriter(
      std::move(owned), std::move(producer).value(), view, rank, std::move(writer)));
}

IpcPoolWriter::IpcPoolWriter(std::shared_ptr<const ControlSegment> control,
                                 MpscProducer producer, ClaimWriterView view, uint32_t rank,
                                 std::string writer)
    : control_(std::move(control)),
      writer_(std::move(writer)),
      producer_(std::move(producer)),
      view_(view),
      rank_(rank) {}

IpcPoolWriter::~IpcPoolWriter() {
  view_.set_announcement(0);
}

namespace {

// What the claims say of a write of `runs` by the key found as `mine`: 0 when
// it may go ahead, else the first block that refuses it.
struct Verdict {
  bool ok = true;
  bool undeclared = false;  // mine is open but the block is not claimed by it
  uint32_t block = 0;
};

Verdict judge(const ClaimWriterView& view, const ClaimLookup& mine,
              std::span<const BlockRun> runs) {
  for (const BlockRun& r : runs) {
    for (uint32_t b = r.dst_block; b < r.dst_block + r.count; ++b) {
      const uint32_t claim = view.claim_of(b);
      if (mine.state == ClaimState::kOpen && claim != mine.entry + 1)
        return Verdict{false, true, b};
      if (mine.state == ClaimState::kFree && claim != 0) return Verdict{false, false, b};
    }
  }
  return {};
}

// The owner opens a claim by publishing its entry, then the claims of its
// blocks one by one (shm/claim_table.h), so a writer can look at the table
// in the middle of its own request's opening: its entry not yet published
// while a block's claim is (the entry has changed by the time it looks
// again), or the entry published and a claim still on its way. A refusal
// is trusted only once the entry reads the same after the blocks as before,
// and, for a block its open entry does not claim, once this long has passed
// (long enough for an owner preempted in the middle of an opening; only a
// misbehaving engine's write waits it out, once, before its request fails).
constexpr uint64_t kOpeningSettleNs = 20'000'000;

}  // namespace

Status IpcPoolWriter::admit(uint64_t key, uint32_t layer, std::span<const BlockRun> runs) {
  const uint64_t epoch = view_.announce(writes_.empty() ? 0 : writes_.front());
  auto refuse = [&](std::string why, bool tell) -> Status {
    announce_oldest();
    if (tell) {
      queue(key, layer, runs, true, false);
      flush();  // the rank fails its request now
    }
    return make_error(Errc::kInvalidArgument, std::move(why));
  };
  const uint64_t settle_by = mono_now_ns() + kOpeningSettleNs;
  for (;;) {
    const ClaimLookup mine = view_.lookup(key, mono_now_ns());
    if (mine.state == ClaimState::kClosed)
      return refuse(fmt::format("the request has already arrived at decode rank {} or was "
                                "withdrawn there",
                                rank_),
                    false);
    const Verdict v = judge(view_, mine, runs);
    if (v.ok) break;
    const ClaimLookup again = view_.lookup(key, mono_now_ns());
    const bool moved = again.state != mine.state || again.entry != mine.entry;
    if (moved || (v.undeclared && mono_now_ns() < settle_by)) {
      cpu_relax();
      continue;
    }
    if (v.undeclared)
      return refuse(fmt::format("a write of the request goes to destination block {} of decode "
                                "rank {}, which it did not declare",
                                v.block, rank_),
                    true);
    return refuse(fmt::format("destination block {} of decode rank {} is declared by another "
                              "request (ExpectArrival)",
                              v.block, rank_),
                  false);
  }
  writes_.push_back(epoch);
  return {};
}

void IpcPoolWriter::abandon_last() {
  if (!writes_.empty()) writes_.pop_back();
  announce_oldest();
}

void IpcPoolWriter::landed(uint64_t key, uint32_t layer, std::span<const BlockRun> runs,
                             const HeadShare* share) {
  queue(key, layer, runs, false, true, share);
  flush();
}

void IpcPoolWriter::queue(uint64_t key, uint32_t layer, std::span<const BlockRun> runs,
                            bool refused, bool releases_write, const HeadShare* share) {
  size_t done = 0;
  do {
    const size_t n = std::min(kRunsPerRecord, runs.size() - done);
    // The first segment in our own zeroed scratch: no allocation per record.
    scratch_.assign(16 + n + (writer_.size() + 8) / 8, 0);
    capnp::MallocMessageBuilder message(
        kj::arrayPtr(reinterpret_cast<capnp::word*>(scratch_.data()), scratch_.size()));
    auto landed = message.initRoot<schema::IpcLanded>();
    landed.setRequestKey(key);
    landed.setWriterInstance(writer_);
    landed.setLayer(layer);
    landed.setRefused(refused);
    landed.setLandedNs(mono_now_ns());
    if (share != nullptr) {
      landed.setFirstHead(share->dst_head);
      landed.setHeads(share->heads);
    }
    auto firsts = landed.initFirstBlocks(static_cast<unsigned>(n));
    auto counts = landed.initBlockCounts(static_cast<unsigned>(n));
    for (size_t i = 0; i < n; ++i) {
      firsts.set(static_cast<unsigned>(i), runs[done + i].dst_block);
      counts.set(static_cast<unsigned>(i), runs[done + i].count);
    }
    done += n;
    const bool last = releases_write && (refused || done == runs.size());
    const size_t bytes = messages::encoded_bytes(message);
    // Straight into the ring when nothing waits before it and there is room.
    if (pending_.empty()) {
      Status s = producer_.write_with(
          static_cast<int32_t>(schema::MessageType::IPC_LANDED), bytes,
          [&](std::span<std::byte> out) {
            messages::encode_into(message, out);
            return true;
          },
          Deadline::now());
      if (s) {
        if (last && !writes_.empty()) writes_.pop_front();
        sent_ = true;
        continue;
      }
    }
    Pending p;
    p.record.resize(bytes);
    messages::encode_into(message, p.record);
    p.releases_write = last;
    p.since_ns = mono_now_ns();
    pending_.push_back(std::move(p));
  } while (!refused && done < runs.size());  // the first runs are enough to fail a request
}

bool IpcPoolWriter::flush() {
  bool sent = std::exchange(sent_, false);
  while (!pending_.empty()) {
    Pending& p = pending_.front();
    Status s = producer_.try_write(static_cast<int32_t>(schema::MessageType::IPC_LANDED), p.record);
    if (!s && s.code() == Errc::kFull && mono_now_ns() - p.since_ns < ns_of(kGiveUpAfter)) break;
    if (!s)
      spdlog::warn(
          "decode rank {}'s landed ring: dropped a landed record ({}); its request "
          "there ends at its deadline",
          rank_, s.error().message);
    if (p.releases_write && !writes_.empty()) writes_.pop_front();
    pending_.pop_front();
    sent = true;
  }
  if (sent) {
    announce_oldest();
    notify_waiters(control_->status().worker_doorbell[rank_]);
  }
  return pending_.empty();
}

void IpcPoolWriter::announce_oldest() {
  view_.set_announcement(writes_.empty() ? 0 : writes_.front());
}

}  // namespace kvrelay::worker

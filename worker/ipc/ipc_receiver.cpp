#include "worker/ipc/ipc_receiver.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "schemas/codec.h"
#include "shm/clock.h"

namespace kvrelay::worker {

Status replay_landed(std::span<const std::byte> payload, const PoolGeometry& pool,
                     Arrivals& arrivals, uint64_t* landed_ns) {
  return messages::with_message<schema::IpcLanded>(
      payload, [&](schema::IpcLanded::Reader landed) -> Status {
        const uint64_t stamp = landed.getLandedNs();
        if (landed_ns != nullptr) *landed_ns = stamp;
        const auto firsts = landed.getFirstBlocks();
        const auto counts = landed.getBlockCounts();
        const uint32_t layer = landed.getLayer();
        if (firsts.size() != counts.size())
          return make_error(Errc::kInvalidArgument, fmt::format("{} first blocks but {} counts",
                                                                firsts.size(), counts.size()));
        if (layer >= pool.total_layers())
          return make_error(
              Errc::kInvalidArgument,
              fmt::format("layer {} does not exist (the pool has {})", layer, pool.total_layers()));
        const uint32_t blocks = pool.blocks_in_layer(layer);
        // Heterogeneous TP: a head range of each block (all heads: whole blocks).
        const uint32_t first_head = landed.getFirstHead();
        const uint32_t heads = landed.getHeads() == pool.kv_heads ? 0 : landed.getHeads();
        if (heads != 0 && uint64_t{first_head} + heads > pool.kv_heads)
          return make_error(Errc::kInvalidArgument,
                            fmt::format("heads {}..{} are outside the pool's {} heads per block",
                                        first_head, uint64_t{first_head} + heads, pool.kv_heads));
        for (uint32_t i = 0; i < firsts.size(); ++i) {
          const uint64_t first = firsts[i], count = counts[i];
          if (count == 0 || first + count > blocks)
            return make_error(Errc::kInvalidArgument,
                              fmt::format("blocks {}..{} of layer {} are outside its {} blocks",
                                          first, first + count, layer, blocks));
        }
        const std::string_view sender(landed.getWriterInstance().cStr(),
                                      landed.getWriterInstance().size());
        const auto apply = [&](const LandedWrite& w) {
          // A refused write wrote nothing: admitting it only applies the rules
          // (a declared request's write outside its blocks fails it).
          if (!arrivals.admit(w)) return;
          if (landed.getRefused()) {
            arrivals.abandoned(w);
          } else {
            arrivals.landed(w);
          }
        };
        for (uint32_t i = 0; i < firsts.size(); ++i) {
          for (uint32_t slot = 0; slot < pool.tensors_per_layer(); ++slot) {
            const PoolTensor tensor = pool.tensor_at(slot);
            const auto t = static_cast<uint32_t>(tensor);  // landed writes name it by its id
            const uint64_t block = pool.block_bytes(tensor);
            if (heads == 0 || landed.getRefused()) {
              apply(LandedWrite{landed.getRequestKey(), layer, t, firsts[i] * block,
                                counts[i] * block, sender, stamp});
              continue;
            }
            const uint64_t head = block / pool.kv_heads;
            for (uint64_t b = firsts[i]; b < uint64_t{firsts[i]} + counts[i]; ++b)
              apply(LandedWrite{landed.getRequestKey(), layer, t, b * block + first_head * head,
                                heads * head, sender, stamp});
          }
        }
        return {};
      });
}

Result<std::unique_ptr<IpcReceiver>> IpcReceiver::open(const ControlSegment& control, uint32_t rank,
                                                   const PoolGeometry& pool,
                                                   std::shared_ptr<Arrivals> arrivals) {
  Result<MpscRing> ring = control.landed_ring(rank);
  if (!ring) return ring.error();
  const uint32_t blocks = claim_table_blocks(control.config());
  std::span<std::byte> table = control.claim_table(rank);
  if (table.size() < claim_table_bytes(blocks))
    return make_error(Errc::kCorrupt, fmt::format("rank {}'s claim table is {} bytes, not {}",
                                                  rank, table.size(), claim_table_bytes(blocks)));
  std::unique_ptr<IpcReceiver> receiver(
      new IpcReceiver(std::move(ring).value(), table, blocks, rank, pool, std::move(arrivals)));
  receiver->owner_.reset();
  return receiver;
}

IpcReceiver::IpcReceiver(MpscRing ring, std::span<std::byte> table, uint32_t blocks, uint32_t rank,
                     const PoolGeometry& pool, std::shared_ptr<Arrivals> arrivals)
    : ring_(std::move(ring)),
      owner_(table, blocks),
      rank_(rank),
      pool_(pool),
      arrivals_(std::move(arrivals)) {}

Status IpcReceiver::expect(uint64_t handle, uint64_t key, std::span<const uint32_t> blocks) {
  if (Status s = owner_.open(key, blocks, mono_now_ns()); !s)
    return make_error(s.code(), fmt::format("rank {}: cannot claim its blocks for ipc writers: {}",
                                            rank_, s.error().message));
  keys_[handle] = key;
  return {};
}

void IpcReceiver::close(uint64_t handle) {
  auto it = keys_.find(handle);
  if (it == keys_.end()) return;
  const uint64_t epoch = owner_.close(it->second, mono_now_ns());
  keys_.erase(it);
  if (epoch != 0) close_epochs_[handle] = epoch;
}

bool IpcReceiver::settled(uint64_t handle) const {
  auto it = close_epochs_.find(handle);
  if (it == close_epochs_.end()) return keys_.count(handle) == 0;
  return owner_.quiescent(it->second, [&](uint32_t w) { return ring_.producer_liveness(w); });
}

size_t IpcReceiver::drain(size_t max_records) {
  const size_t n = ring_.read(
      [&](const MpscRecord& rec) {
        if (rec.defect != nullptr ||
            rec.type != static_cast<int32_t>(schema::MessageType::IPC_LANDED)) {
          spdlog::error("rank {}: unexpected record (type {}{}) on the landed ring", rank_,
                        rec.type, rec.defect != nullptr ? fmt::format(", {}", rec.defect) : "");
          return;
        }
        const uint64_t read_ns = mono_now_ns();
        uint64_t stamp = 0;
        if (Status s = replay_landed(rec.payload, pool_, *arrivals_, &stamp); !s)
          spdlog::warn("rank {}: dropped an ipc landed record: {}", rank_, s.error().message);
        // The writer's stamp: timed only when it is sane, like every stamp
        // from another process.
        if (const auto waited = stamp_age(stamp, read_ns); hop_observer_ && waited)
          hop_observer_(*waited);
      },
      max_records);
  if (auto what = ring_.take_corruption()) spdlog::error("rank {}: landed ring: {}", rank_, *what);
  return n;
}

}  // namespace kvrelay::worker

#include "worker/ipc/ipc_transport.h"

#include <capnp/serialize.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>

#include "instance/fd_socket.h"
#include "schemas/codec.h"
#include "schemas/pool_descriptor.h"
#include "schemas/validate.h"
#include "worker/imported_pool.h"
#include "worker/pool_compatibility.h"

namespace kvrelay::worker {

namespace {
const std::shared_ptr<IpcPoolWriter> kNone;
}

class IpcTransport::PoolDestination final : public Destination {
 public:
  PoolDestination(IpcTransport& transport, std::vector<Part> parts, std::string name)
      : transport_(transport),
        parts_(std::make_shared<const std::vector<Part>>(std::move(parts))),
        name_(std::move(name)) {}
  uint32_t blocks_in_layer(uint32_t layer) const override {
    // No parts: a replica whose heads other ranks send; it writes nothing,
    // and the ranks that do check the ids.
    uint32_t blocks = UINT32_MAX;
    for (const Part& p : *parts_)
      blocks = std::min(blocks, p.pool->geometry().blocks_in_layer(layer));
    return blocks;
  }
  const std::string& peer() const override { return name_; }
  Status submit_layer(const TransferTicket& ticket, uint32_t layer,
                      std::span<const BlockRun> runs) override {
    return transport_.submit(ticket, layer, runs, parts_);
  }

 private:
  IpcTransport& transport_;
  std::shared_ptr<const std::vector<Part>> parts_;
  std::string name_;
};

IpcTransport::IpcTransport(uint32_t rank, const LocalPool& local,
                           std::unique_ptr<kernels::CopyEngine> engine, HeadLayout heads,
                           std::string instance)
    : rank_(rank),
      local_(local),
      heads_(heads),
      instance_(std::move(instance)),
      engine_(std::move(engine)) {}

IpcTransport::~IpcTransport() {
  // The engine may still read the scratch runs and write the peer pools.
  for (InFlight& f : in_flight_.live())
    (void)engine_->wait(f.copy);
}

Status IpcTransport::submit(const TransferTicket& ticket, uint32_t layer,
                            std::span<const BlockRun> runs,
                            const std::shared_ptr<const std::vector<Part>>& parts) {
  std::unique_ptr<Scratch> scratch;
  if (spare_scratch_.empty()) {
    scratch = std::make_unique<Scratch>();
  } else {
    scratch = std::move(spare_scratch_.back());
    spare_scratch_.pop_back();
  }
  const auto give_back = [&] {
    for (const Part* p : scratch->tracked)
      p->writer->abandon_last();
    scratch->tracked.clear();
    spare_scratch_.push_back(std::move(scratch));
  };
  scratch->targets.clear();
  scratch->tracked.clear();
  for (const Part& p : *parts) {
    // Until the decode engine asks for an expected request, its ranks'
    // claims are empty and nobody counts: skip them (one load).
    if (p.writer && p.writer->in_use()) {
      if (Status s = p.writer->admit(ticket.request_key, layer, runs); !s) {
        if (p.writer->backlog()) note_backlog(p.writer);
        give_back();
        return s;
      }
      scratch->tracked.push_back(&p);
    }
    scratch->targets.push_back(CopyTarget{p.pool.get(), p.share ? &*p.share : nullptr});
  }
  Result<StartedLayerCopy> started =
      start_layer_copy(*engine_, local_, scratch->targets, layer, runs, scratch->copy);
  if (!started) {
    give_back();
    return started.error();
  }
  if (!scratch->tracked.empty()) scratch->runs.assign(runs.begin(), runs.end());
  in_flight_.push_back(
      InFlight{ticket, started->ticket, started->bytes, layer, parts, std::move(scratch)});
  return {};
}

void IpcTransport::note_backlog(const std::shared_ptr<IpcPoolWriter>& writer) {
  if (std::find(backlogged_.begin(), backlogged_.end(), writer) == backlogged_.end())
    backlogged_.push_back(writer);
}

void IpcTransport::flush_landed() {
  std::erase_if(backlogged_, [](const std::shared_ptr<IpcPoolWriter>& w) { return w->flush(); });
}

void IpcTransport::poll(std::vector<TransferCompletion>& out) {
  bool fenced = false;
  while (!in_flight_.empty() && engine_->done(in_flight_.front().copy)) {
    InFlight& f = in_flight_.front();
    if (!fenced) {
      // Order the copies before the report that publishes them.
      std::atomic_thread_fence(std::memory_order_seq_cst);
      fenced = true;
    }
    TransferCompletion c;
    c.ticket = f.ticket;
    c.bytes = f.bytes;
    // A failed copy engine is sticky: every copy it had in flight failed.
    c.status = engine_->failure();
    if (c.status) c.status = local_.check_intact();
    for (const Part& p : *f.parts)
      if (c.status) c.status = p.pool->check_intact();
    for (const Part* p : f.scratch->tracked) {
      p->writer->landed(f.ticket.request_key, f.layer, f.scratch->runs,
                        p->share ? &*p->share : nullptr);
      if (p->writer->backlog()) note_backlog(p->writer);
    }
    f.scratch->tracked.clear();
    out.push_back(std::move(c));
    spare_scratch_.push_back(std::move(f.scratch));
    in_flight_.pop_front();
  }
}

Result<std::shared_ptr<const LocalPool>> IpcTransport::peer_pool(const std::string& peer_instance,
                                                                 uint32_t peer_rank) {
  Result<Mapped> m = mapped(peer_instance, peer_rank);
  if (!m) return m.error();
  return m->pool;
}

Result<std::shared_ptr<const LocalPool>> IpcTransport::fetch_tensor_table(
    const std::string& peer_instance, uint32_t peer_rank, const ControlSegment& control,
    const PublishedPool& published) {
  if (local_.memory_kind() != kernels::MemoryKind::kCuda &&
      (published.location == PoolLocation::kCudaIpc ||
       published.location == PoolLocation::kCudaVmm))
    return make_error(Errc::kUnsupported,
                      fmt::format("its pool is GPU memory ({}) and this rank's is host memory: "
                                  "register this rank's GPU pool too, or use tcp",
                                  published.name));
  Result<SharedPool> shared = fetch_shared_pool(peer_instance, peer_rank, PoolTier::kDevice,
                                                Deadline::after(std::chrono::seconds(2)));
  if (!shared) return shared.error();
  // Input from another process: decoded with a traversal limit, and held
  // to the rules the coordinator applied to the engine's registration.
  if (shared->descriptor.size() % sizeof(capnp::word) != 0)
    return make_error(Errc::kCorrupt, "its worker sent a descriptor of a ragged size");
  std::vector<capnp::word> words(shared->descriptor.size() / sizeof(capnp::word));
  std::memcpy(words.data(), shared->descriptor.data(), shared->descriptor.size());
  return messages::with_message<schema::RegisterPool>(
      std::as_bytes(std::span<const capnp::word>(words)),
      [&](schema::RegisterPool::Reader reg) -> Result<std::shared_ptr<const LocalPool>> {
        if (Status s = messages::validate(reg, messages::Limits::from(control.config())); !s)
          return s.error();
        const std::string name =
            fmt::format("{}:{:016x}", location_name(reg.getPool().getLocation()), shared->ticket);
        if (name != published.name)
          return make_error(Errc::kNotReady,
                            fmt::format("its engine registered another pool meanwhile ({} is "
                                        "published, {} was served)",
                                        published.name, name));
        Result<std::unique_ptr<ImportedPool>> pool =
            ImportedPool::open(reg.getPool(), messages::shape_of(reg.getPool()), shared->fds,
                               local_.cuda_device(), name);
        if (!pool && published.location == PoolLocation::kCudaIpc)
          // The usual cause where the peer's GPU is another one (the VMM path
          // checks it and says so): no peer-to-peer access between the two.
          return make_error(pool.code(),
                            fmt::format("{} (a pool on another GPU opens only where this "
                                        "rank's GPU can reach it peer to peer, over NVLink or "
                                        "PCIe P2P; where it cannot, use tcp)",
                                        pool.error().message));
        if (!pool) return pool.error();
        spdlog::info("rank {}: mapped decode instance '{}' rank {}'s pool {} ({} MiB)", rank_,
                     peer_instance, peer_rank, name, (*pool)->bytes() >> 20);
        return std::shared_ptr<const LocalPool>(std::move(pool).value());
      });
}

size_t IpcTransport::release_stale() {
  const uint64_t now = mono_now_ns();
  if (now < next_stale_check_ns_ || pools_.empty()) return 0;
  next_stale_check_ns_ = now + 200'000'000;
  return std::erase_if(pools_, [&](const auto& entry) {
    const std::string& key = entry.first;
    const size_t slash = key.rfind('/');
    const std::string instance = key.substr(0, slash);
    const auto rank = static_cast<uint32_t>(std::stoul(key.substr(slash + 1)));
    Result<std::shared_ptr<const ControlSegment>> control = peers_.share(instance);
    bool stale = !control || *control != entry.second.control;
    if (!stale) {
      Result<PublishedPool> published = find_published_pool(**control, rank, PoolTier::kDevice);
      stale = !published || published->name != entry.second.pool->name();
    }
    // Copies in flight hold the pool (InFlight::parts) until they are done.
    if (stale)
      spdlog::info("rank {}: unmapping {} of decode instance '{}' rank {}: {}", rank_,
                   entry.second.pool->name(), instance, rank,
                   !control ? "its coordinator is gone" : "it was replaced");
    return stale;
  });
}

Result<IpcTransport::Mapped> IpcTransport::mapped(const std::string& peer_instance,
                                                  uint32_t peer_rank) {
  Result<std::shared_ptr<const ControlSegment>> shared = peers_.share(peer_instance);
  if (!shared) return shared.error();
  const std::shared_ptr<const ControlSegment>& control = *shared;
  const std::string key = fmt::format("{}/{}", peer_instance, peer_rank);
  auto it = pools_.find(key);
  // Keep the mapping while the peer's segment and its pool are the same
  // (re-mapping a pool costs a populate of every page); a restarted peer has
  // a new segment, a decode engine that registered its own pool a new pool.
  Result<PublishedPool> published = find_published_pool(*control, peer_rank, PoolTier::kDevice);
  if (it != pools_.end() && it->second.control == control && !it->second.pool->truncated() &&
      published && published->name == it->second.pool->name())
    return it->second;
  const InstanceConfig& peer = control->config();
  if (peer.role != static_cast<uint32_t>(Role::kDecode))
    return make_error(Errc::kInvalidArgument,
                      fmt::format("peer instance '{}' has role {}; only a decode instance accepts "
                                  "transfers",
                                  peer_instance, role_name(static_cast<Role>(peer.role))));
  if (peer_rank >= peer.tp_size)
    return make_error(Errc::kInvalidArgument,
                      fmt::format("decode rank {} does not exist: peer instance '{}' has {} ranks",
                                  peer_rank, peer_instance, peer.tp_size));
  if (!published) return published.error();
  std::shared_ptr<const LocalPool> pool;
  if (published->location == PoolLocation::kHostSegment) {
    Result<HostPool> segment = HostPool::open(published->name, nullptr);
    if (!segment) return segment.error();
    pool = std::make_shared<const HostSegmentPool>(std::move(segment).value());
  } else {
    Result<std::shared_ptr<const LocalPool>> table =
        fetch_tensor_table(peer_instance, peer_rank, *control, *published);
    if (!table)
      return make_error(table.code(), fmt::format("peer instance '{}' rank {}: {}", peer_instance,
                                                  peer_rank, table.error().message));
    pool = std::move(table).value();
  }
  if (Status s =
          check_compatible(local_.geometry(), heads_, pool->geometry(), head_layout_of(peer));
      !s)
    return make_error(s.code(),
                      fmt::format("peer instance '{}': {}", peer_instance, s.error().message));
  Result<std::shared_ptr<IpcPoolWriter>> writer =
      IpcPoolWriter::open(control, peer_rank, instance_);
  if (!writer)
    return make_error(writer.code(),
                      fmt::format("peer instance '{}': {}", peer_instance, writer.error().message));
  Mapped m{control, std::move(pool), std::move(writer).value()};
  pools_[key] = m;
  return m;
}

std::shared_ptr<Destination> IpcTransport::destination_for(
    std::shared_ptr<const LocalPool> peer, std::string peer_name,
    std::shared_ptr<IpcPoolWriter> writer) {
  std::vector<Part> parts{Part{std::move(peer), std::move(writer), std::nullopt}};
  return std::make_shared<PoolDestination>(*this, std::move(parts), std::move(peer_name));
}

std::shared_ptr<Destination> IpcTransport::split_destination_for(
    std::vector<std::pair<std::shared_ptr<const LocalPool>, HeadShare>> parts, std::string name) {
  std::vector<Part> all;
  for (auto& [pool, share] : parts)
    all.push_back(Part{std::move(pool), nullptr, share});
  return std::make_shared<PoolDestination>(*this, std::move(all), std::move(name));
}

Result<std::shared_ptr<Destination>> IpcTransport::resolve_split(schema::CacheDest::Reader,
                                                                 const std::string& instance) {
  Result<std::shared_ptr<const ControlSegment>> control = peers_.share(instance);
  if (!control) return control.error();
  if (Status s = same_model(instance, (*control)->config()); !s) return s.error();
  const HeadLayout theirs = head_layout_of((*control)->config());
  std::vector<Part> parts;
  std::string ranks;
  for (const HeadShare& share : head_shares(heads_, rank_, theirs)) {
    Result<Mapped> m = mapped(instance, share.decode_rank);
    if (!m) return m.error();
    parts.push_back(Part{m->pool, m->writer, share});
    ranks += fmt::format("{}{}", ranks.empty() ? "" : ",", share.decode_rank);
  }
  return std::shared_ptr<Destination>(std::make_shared<PoolDestination>(
      *this, std::move(parts),
      fmt::format("decode instance '{}' rank{} {} over ipc (tp {} -> tp {})", instance,
                  parts.size() == 1 ? "" : "s", ranks.empty() ? "none" : ranks, heads_.tp_size,
                  theirs.tp_size)));
}

Result<std::shared_ptr<Destination>> IpcTransport::resolve(schema::CacheDest::Reader dest) {
  const std::string instance = dest.getPeerInstance().cStr();
  {
    Result<std::shared_ptr<const ControlSegment>> control = peers_.share(instance);
    if (!control) return control.error();
    if (head_layout_of((*control)->config()) != heads_) return resolve_split(dest, instance);
  }
  const auto devices = dest.getDeviceIds();
  if (rank_ >= devices.size())
    return make_error(Errc::kInvalidArgument,
                      fmt::format("device_ids has no entry for rank {}", rank_));
  Result<Mapped> m = mapped(instance, devices[rank_]);
  if (!m) return m.error();
  return destination_for(
      m->pool, fmt::format("decode instance '{}' rank {} over ipc", instance, devices[rank_]),
      m->writer);
}

Status IpcTransport::check_connect(schema::ConnectTask::Reader connect) {
  const std::string instance = connect.getPeerInstance().cStr();
  Result<std::vector<uint32_t>> ranks = decode_ranks(instance);
  if (!ranks) return ranks.error();
  for (uint32_t rank : *ranks)
    if (Result<Mapped> m = mapped(instance, rank); !m) return m.error();
  return {};
}

Result<std::vector<uint32_t>> IpcTransport::decode_ranks(const std::string& instance) {
  Result<std::shared_ptr<const ControlSegment>> control = peers_.share(instance);
  if (!control) return control.error();
  if (Status s = same_model(instance, (*control)->config()); !s) return s.error();
  const HeadLayout theirs = head_layout_of((*control)->config());
  if (theirs == heads_) return std::vector<uint32_t>{rank_};
  std::vector<uint32_t> ranks;
  for (const HeadShare& share : head_shares(heads_, rank_, theirs))
    ranks.push_back(share.decode_rank);
  return ranks;
}

Status IpcTransport::same_model(const std::string& instance, const InstanceConfig& peer) const {
  // The kind first (K only against K and V): an MLA cache against a GQA one
  // differs in heads too, and the kind is what is wrong.
  const PoolGeometry peer_pool = pool_geometry_of(peer, PoolTier::kDevice);
  if (peer_pool.k_only != local_.geometry().k_only) {
    const Status kinds = check_compatible(local_.geometry(), peer_pool);
    return make_error(kinds.code(),
                      fmt::format("peer instance '{}': {}", instance, kinds.error().message));
  }
  const HeadLayout theirs = head_layout_of(peer);
  if (theirs.total_heads == heads_.total_heads) return {};
  return make_error(Errc::kLayoutMismatch,
                    fmt::format("peer instance '{}' has {} KV heads in all (tp {}, {} per rank), "
                                "this instance {} (tp {}, {} per rank)",
                                instance, theirs.total_heads, theirs.tp_size, theirs.heads_per_rank,
                                heads_.total_heads, heads_.tp_size, heads_.heads_per_rank));
}

}  // namespace kvrelay::worker

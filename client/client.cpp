#include "kvrelay/client.h"

#include <capnp/message.h>
#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "schemas/codec.h"
#include "schemas/records.h"
#include "schemas/validate.h"
#include "shm/control_segment.h"
#include "shm/liveness.h"
#include "shm/pool_segment.h"

namespace kvrelay {

namespace {

using records::LayerSignal;
using records::SignalKind;
using schema::MessageType;

template <class T>
void set_u32_list(capnp::List<uint32_t>::Builder list, const std::vector<T>& values) {
  for (unsigned i = 0; i < values.size(); ++i)
    list.set(i, values[i]);
}
void set_u16_list(capnp::List<uint16_t>::Builder list, const std::vector<uint16_t>& values) {
  for (unsigned i = 0; i < values.size(); ++i)
    list.set(i, values[i]);
}

schema::TransferProtocol to_schema(Protocol p) {
  return static_cast<schema::TransferProtocol>(p);
}

constexpr auto kCoordinatorCheck = std::chrono::milliseconds(100);

}  // namespace

const char* completion_status_name(CompletionStatus s) {
  switch (s) {
    case CompletionStatus::kFinished: return "finished";
    case CompletionStatus::kError: return "error";
    case CompletionStatus::kCancelled: return "cancelled";
    case CompletionStatus::kTimeout: return "timeout";
    case CompletionStatus::kRejected: return "rejected";
  }
  return "unknown";
}

struct Client::Impl {
  ControlSegment control;
  InstanceConfig config;
  MpscRing submit;
  MpscRing completions;
  messages::Limits limits;
  std::vector<std::optional<SpscRing<LayerSignal>>> signals;
  // Checked on every submit: its /proc check runs at most every 10 ms.
  mutable CachedPeerJudge coordinator_judge;

  explicit Impl(ControlSegment c)
      : control(std::move(c)),
        config(control.config()),
        submit(control.submit_ring().value()),
        completions(control.completion_ring().value()),
        limits(messages::Limits::from(config)),
        signals(config.tp_size) {
    // Map every rank's signal ring now, so that no push ever allocates.
    for (uint32_t r = 0; r < config.tp_size; ++r) {
      auto ring = control.signal_ring<LayerSignal>(r);
      if (ring) signals[r] = *ring;
    }
  }

  Status alive() const {
    if (control.state() == InstanceState::kDead)
      return make_error(Errc::kCoordinatorGone,
                        fmt::format("instance '{}' has shut down", control.instance()));
    const SlotSnapshot s = read_slot(control.coordinator_slot());
    if (coordinator_judge.judge(s, std::chrono::milliseconds(config.peer_timeout_ms)) ==
        PeerHealth::kDead)
      return make_error(Errc::kCoordinatorGone,
                        fmt::format("the coordinator of instance '{}' (pid {}) is gone",
                                    control.instance(), s.owner.pid));
    return {};
  }

  // Writes one message to the submit ring, waiting for room in slices so
  // that a dead coordinator turns into an error, not a wait to the deadline.
  Status write(MessageType type, capnp::MessageBuilder& msg, Deadline deadline) {
    if (Status s = alive(); !s) return s;
    for (;;) {
      Deadline slice = Deadline::after(kCoordinatorCheck);
      if (deadline.ns() < slice.ns()) slice = deadline;
      Status s = messages::write_message(submit, type, msg, slice);
      if (s.ok()) {
        notify_waiters(control.status().coordinator_doorbell);
        return {};
      }
      if (s.code() != Errc::kTimeout && s.code() != Errc::kFull) return s;
      if (Status a = alive(); !a) return a;
      if (deadline.passed())
        return make_error(Errc::kFull,
                          fmt::format("the submit ring of instance '{}' stayed full until the "
                                      "deadline; nothing was written",
                                      control.instance()));
    }
  }

  Result<SpscRing<LayerSignal>*> signal_ring(uint32_t rank) {
    if (rank >= config.tp_size)
      return make_error(Errc::kInvalidArgument,
                        fmt::format("rank {} out of range: instance '{}' has {} ranks", rank,
                                    control.instance(), config.tp_size));
    if (!signals[rank]) {
      auto ring = control.signal_ring<LayerSignal>(rank);
      if (!ring) return ring.error();
      signals[rank] = *ring;
    }
    return &*signals[rank];
  }

  Status push(uint32_t rank, const LayerSignal& s, Deadline deadline) {
    Result<SpscRing<LayerSignal>*> ring = signal_ring(rank);
    if (!ring) return ring.error();
    if (!(*ring)->try_push(s)) {
      for (;;) {
        Deadline slice = Deadline::after(kCoordinatorCheck);
        if (deadline.ns() < slice.ns()) slice = deadline;
        if ((*ring)->push(s, slice).ok()) break;
        if (Status a = alive(); !a) return a;
        if (deadline.passed())
          return make_error(Errc::kFull, fmt::format("rank {}'s signal ring stayed full until the "
                                                     "deadline (is its worker running?)",
                                                     rank));
      }
    }
    notify_waiters(control.status().worker_doorbell[rank]);
    return {};
  }
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::Client(Client&&) noexcept = default;
Client& Client::operator=(Client&&) noexcept = default;
Client::~Client() = default;

Result<Client> Client::attach(std::string_view instance, Deadline ready_by) {
  // The coordinator may still be starting (no segment yet), or replacing a
  // stale one: keep trying until the deadline.
  Result<ControlSegment> control = ControlSegment::attach(instance);
  while (!control &&
         (control.code() == Errc::kNotFound || control.code() == Errc::kNotReady ||
          control.code() == Errc::kStale) &&
         !ready_by.passed()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    control = ControlSegment::attach(instance);
  }
  if (!control) {
    if (control.code() == Errc::kStale)
      return make_error(Errc::kCoordinatorGone, control.error().message);
    return control.error();
  }
  auto impl = std::make_unique<Impl>(std::move(control).value());
  const ControlSegment& c = impl->control;
  const bool ready = wait_until(
      c.status().state_changed, [&] { return c.state() != InstanceState::kInitialising; },
      ready_by);
  if (Status s = impl->alive(); !s) return s.error();
  if (!ready || c.state() != InstanceState::kReady)
    return make_error(Errc::kTimeout,
                      fmt::format("instance '{}' is {}, not ready, at the deadline", c.instance(),
                                  instance_state_name(static_cast<uint32_t>(c.state()))));
  return Client(std::move(impl));
}

uint32_t Client::request_tag(std::string_view request_id) {
  return records::request_tag(request_id);
}

const InstanceConfig& Client::config() const {
  return impl_->config;
}
uint64_t Client::epoch() const {
  return impl_->control.epoch();
}
bool Client::rank_ready(uint32_t rank) const {
  return rank < impl_->config.tp_size &&
         impl_->control.status().ready_flags[rank].load(std::memory_order_acquire) == 1;
}
Status Client::coordinator_alive() const {
  return impl_->alive();
}

Status Client::submit(const CacheTaskSpec& spec, Deadline deadline) {
  capnp::MallocMessageBuilder msg;
  auto t = msg.initRoot<schema::CacheTask>();
  t.setRequestId(spec.request_id);
  set_u32_list(t.initSrcBlockIds(static_cast<unsigned>(spec.src_block_ids.size())),
               spec.src_block_ids);
  t.setNeedPrefillTokens(spec.need_prefill_tokens);
  t.setDeadlineMs(spec.deadline_ms);
  if (spec.engine_slot.has_value() == spec.legacy_prefill_step.has_value())
    return make_error(Errc::kInvalidArgument,
                      fmt::format("CacheTask '{}': set exactly one of engine_slot (per-chunk mode) "
                                  "and legacy_prefill_step (legacy mode)",
                                  spec.request_id));
  if (spec.engine_slot) t.setEngineSlot(*spec.engine_slot);
  if (spec.legacy_prefill_step) t.setLegacyPrefillStep(*spec.legacy_prefill_step);
  if (Status s = messages::validate(t.asReader(), impl_->limits); !s) return s;
  return impl_->write(MessageType::CACHE_TASK, msg, deadline);
}

Status Client::submit(const CacheDestSpec& spec, Deadline deadline) {
  capnp::MallocMessageBuilder msg;
  auto d = msg.initRoot<schema::CacheDest>();
  d.setRequestId(spec.request_id);
  set_u32_list(d.initDestBlockIds(static_cast<unsigned>(spec.dest_block_ids.size())),
               spec.dest_block_ids);
  d.setProtocol(to_schema(spec.protocol));
  d.setPeerInstance(spec.peer_instance);
  d.setPeerAddress(spec.peer_address);
  set_u16_list(d.initRdmaPorts(static_cast<unsigned>(spec.rdma_ports.size())), spec.rdma_ports);
  set_u16_list(d.initTcpPorts(static_cast<unsigned>(spec.tcp_ports.size())), spec.tcp_ports);
  set_u32_list(d.initDeviceIds(static_cast<unsigned>(spec.device_ids.size())), spec.device_ids);
  d.setErrorMessage(spec.error_message);
  if (Status s = messages::validate(d.asReader(), impl_->limits); !s) return s;
  return impl_->write(MessageType::CACHE_DEST, msg, deadline);
}

Status Client::submit(const SwapSpec& spec, Deadline deadline) {
  capnp::MallocMessageBuilder msg;
  auto s = msg.initRoot<schema::SwapTask>();
  s.setRequestId(spec.request_id);
  s.setDirection(spec.load ? schema::SwapTask::Direction::LOAD
                           : schema::SwapTask::Direction::EVICT);
  set_u32_list(s.initDeviceBlockIds(static_cast<unsigned>(spec.device_block_ids.size())),
               spec.device_block_ids);
  set_u32_list(s.initHostBlockIds(static_cast<unsigned>(spec.host_block_ids.size())),
               spec.host_block_ids);
  s.setFirstLayer(spec.first_layer);
  s.setLayerCount(spec.layer_count);
  s.setDeadlineMs(spec.deadline_ms);
  if (Status v = messages::validate(s.asReader(), impl_->limits); !v) return v;
  return impl_->write(MessageType::SWAP_TASK, msg, deadline);
}

Status Client::submit(const ConnectSpec& spec, Deadline deadline) {
  capnp::MallocMessageBuilder msg;
  auto c = msg.initRoot<schema::ConnectTask>();
  c.setTaskId(spec.task_id);
  c.setProtocol(to_schema(spec.protocol));
  c.setPeerInstance(spec.peer_instance);
  c.setPeerAddress(spec.peer_address);
  set_u16_list(c.initPorts(static_cast<unsigned>(spec.ports.size())), spec.ports);
  if (Status s = messages::validate(c.asReader(), impl_->limits); !s) return s;
  return impl_->write(MessageType::CONNECT_TASK, msg, deadline);
}

Status Client::register_pool(const PoolSpec& spec, Deadline deadline) {
  const PoolTier tier = spec.host_tier ? PoolTier::kHost : PoolTier::kDevice;
  const PoolGeometry g = PoolGeometry::from(impl_->config, tier);
  capnp::MallocMessageBuilder msg;
  auto p = msg.initRoot<schema::RegisterPool>().initPool();
  p.setRank(spec.rank);
  p.setTier(spec.host_tier ? schema::PoolDescriptor::Tier::HOST
                           : schema::PoolDescriptor::Tier::DEVICE);
  p.setLocation(schema::PoolDescriptor::Location::HOST_SEGMENT);
  p.setSegmentName(spec.segment_name);
  p.setNumLayers(g.num_layers);
  p.setExtraLayers(g.extra_layers);
  p.setNumBlocks(g.num_blocks);
  p.setExtraLayerBlocks(g.extra_layer_blocks);
  p.setKvHeads(g.kv_heads);
  p.setBlockSize(g.block_size);
  p.setHeadDim(g.head_dim);
  p.setDtype(static_cast<schema::CacheDtype>(g.dtype));
  p.setHasScales(g.has_scales != 0);
  if (Status s = messages::validate(msg.getRoot<schema::RegisterPool>().asReader(), impl_->limits);
      !s)
    return s;
  return impl_->write(MessageType::REGISTER_POOL, msg, deadline);
}

Status Client::cancel(std::string_view request_id, Deadline deadline) {
  capnp::MallocMessageBuilder msg;
  auto c = msg.initRoot<schema::Cancel>();
  c.setRequestId(std::string(request_id));
  if (Status s = messages::validate(c.asReader(), impl_->limits); !s) return s;
  return impl_->write(MessageType::CANCEL, msg, deadline);
}

Status Client::push_batch(uint32_t rank, uint64_t step, std::span<const BatchSlot> slots,
                          Deadline deadline) {
  for (size_t start = 0; start < slots.size() || start == 0;
       start += records::kBatchEntriesPerSignal) {
    LayerSignal s{};
    s.kind = static_cast<uint32_t>(SignalKind::kBatch);
    s.step = step;
    const size_t n = std::min<size_t>(records::kBatchEntriesPerSignal, slots.size() - start);
    s.count = static_cast<uint32_t>(n);
    for (size_t i = 0; i < n; ++i) {
      const BatchSlot& b = slots[start + i];
      s.entries[i] = records::BatchEntry{b.slot, b.chunk_token_offset, b.chunk_len, b.request_tag};
    }
    if (Status st = impl_->push(rank, s, deadline); !st) return st;
    if (slots.empty()) break;
  }
  return {};
}

Status Client::push_layer_done(uint32_t rank, uint64_t step, uint32_t layer, Deadline deadline) {
  LayerSignal s{};
  s.kind = static_cast<uint32_t>(SignalKind::kLayerDone);
  s.step = step;
  s.layer = layer;
  return impl_->push(rank, s, deadline);
}

Status Client::push_legacy_layer_done(uint32_t rank, uint64_t step, uint32_t layer,
                                      Deadline deadline) {
  LayerSignal s{};
  s.kind = static_cast<uint32_t>(SignalKind::kLegacyLayerDone);
  s.step = step;
  s.layer = layer;
  return impl_->push(rank, s, deadline);
}

Status Client::wait_layer(std::string_view request_id, uint32_t layer, Deadline deadline,
                          std::optional<uint32_t> rank) {
  const uint32_t tag = records::request_tag(request_id);
  SwapProgressTable& table = impl_->control.swap_progress();
  if (rank && *rank >= impl_->config.tp_size)
    return make_error(Errc::kInvalidArgument, fmt::format("rank {} out of range", *rank));
  // The newest load with this tag (a tag may be reused by a later request).
  auto find = [&]() -> SwapProgressSlot* {
    SwapProgressSlot* best = nullptr;
    for (SwapProgressSlot& slot : table.slots) {
      if (slot.tag.load(std::memory_order_acquire) != tag ||
          slot.state.load(std::memory_order_acquire) ==
              static_cast<uint32_t>(SwapProgressState::kFree))
        continue;
      if (best == nullptr || slot.handle > best->handle) best = &slot;
    }
    return best;
  };
  SwapProgressSlot* slot = nullptr;
  for (;;) {  // the load may not have been dispatched yet
    slot = find();
    if (slot != nullptr) break;
    if (Status a = impl_->alive(); !a) return a;
    if (deadline.passed())
      return make_error(Errc::kTimeout,
                        fmt::format("no load '{}' appeared before the deadline", request_id));
    Deadline slice = Deadline::after(kCoordinatorCheck);
    if (deadline.ns() < slice.ns()) slice = deadline;
    wait_until(
        table.slot_taken, [&] { return find() != nullptr; }, slice);
  }
  if (layer < slot->first_layer || layer >= slot->first_layer + slot->layer_count)
    return make_error(Errc::kInvalidArgument,
                      fmt::format("load '{}' covers layers [{}, {}), not layer {}", request_id,
                                  slot->first_layer, slot->first_layer + slot->layer_count, layer));
  const uint32_t need = layer - slot->first_layer + 1;
  auto ready = [&] {
    for (uint32_t r = 0; r < impl_->config.tp_size; ++r) {
      if (rank && r != *rank) continue;
      if (slot->layers_done[r].load(std::memory_order_acquire) < need) return false;
    }
    return true;
  };
  auto failed = [&] {
    return slot->state.load(std::memory_order_acquire) ==
           static_cast<uint32_t>(SwapProgressState::kFailed);
  };
  for (;;) {
    if (ready()) return {};
    if (failed())
      return make_error(Errc::kAborted,
                        fmt::format("load '{}' failed or was cancelled before layer {} was "
                                    "loaded; its completion says why",
                                    request_id, layer));
    if (Status a = impl_->alive(); !a) return a;
    if (deadline.passed())
      return make_error(Errc::kTimeout,
                        fmt::format("layer {} of load '{}' was not loaded before the deadline",
                                    layer, request_id));
    Deadline slice = Deadline::after(kCoordinatorCheck);
    if (deadline.ns() < slice.ns()) slice = deadline;
    wait_until(
        slot->changed, [&] { return ready() || failed(); }, slice);
  }
}

Result<std::optional<Completion>> Client::poll() {
  std::optional<Completion> out;
  Status decoded;
  impl_->completions.read(
      [&](int32_t type, std::span<const std::byte> payload) {
        if (type != static_cast<int32_t>(MessageType::COMPLETION)) {
          decoded = make_error(Errc::kCorrupt,
                               fmt::format("record of type {} on the completion ring", type));
          return;
        }
        decoded = messages::with_message<schema::Completion>(
            payload, [&](schema::Completion::Reader c) -> Status {
              Completion x;
              x.request_id = c.getRequestId().cStr();
              x.kind = static_cast<CompletionKind>(c.getKind());
              x.status = static_cast<CompletionStatus>(c.getStatus());
              x.error_rank = c.getErrorRank();
              x.message = c.getMessage().cStr();
              x.bytes_moved = c.getBytesMoved();
              x.submitted_ns = c.getSubmittedNs();
              x.completed_ns = c.getCompletedNs();
              x.first_copy_ns = c.getFirstCopyNs();
              out = std::move(x);
              return {};
            });
      },
      1);
  if (!decoded) return decoded.error();
  return out;
}

Result<Completion> Client::wait(Deadline deadline) {
  for (;;) {
    Result<std::optional<Completion>> c = poll();
    if (!c) return c.error();
    if (c->has_value()) return std::move(**c);
    if (Status s = impl_->alive(); !s) return s.error();
    if (deadline.passed())
      return make_error(Errc::kTimeout, "no completion arrived before the deadline");
    Deadline slice = Deadline::after(kCoordinatorCheck);
    if (deadline.ns() < slice.ns()) slice = deadline;
    impl_->completions.wait_readable(slice);
  }
}

Result<std::unique_ptr<HostPool>> Client::open_pool(uint32_t rank, bool host_tier) const {
  Result<std::string> name =
      find_pool(impl_->control, rank, host_tier ? PoolTier::kHost : PoolTier::kDevice);
  if (!name) return name.error();
  Result<HostPool> pool = HostPool::open(*name, nullptr);
  if (!pool) return pool.error();
  return std::make_unique<HostPool>(std::move(pool).value());
}

}  // namespace kvrelay

#include "kvrelay/client.h"

#include <capnp/message.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <mutex>
#include <thread>

#include "client/pool_registration.h"
#include "client/views.h"
#include "instance/control_layout.h"
#include "instance/control_segment.h"
#include "instance/fd_socket.h"
#include "instance/pool_segment.h"
#include "instance/swap_progress.h"
#include "schemas/codec.h"
#include "schemas/message_ring.h"
#include "schemas/pool_descriptor.h"
#include "schemas/records.h"
#include "schemas/validate.h"
#include "shm/counters.h"
#include "shm/intake_table.h"
#include "shm/liveness.h"
#include "shm/process_identity.h"

namespace kvrelay {

namespace {

using records::LayerSignal;
using records::SignalKind;
using schema::MessageType;

// A vector as the list a message field is set from.
template <class T>
kj::ArrayPtr<const T> list_of(const std::vector<T>& values) {
  return kj::arrayPtr(values.data(), values.size());
}

schema::TransferProtocol to_schema(Protocol p) {
  return static_cast<schema::TransferProtocol>(p);
}

// Every waiting call looks at the coordinator at least this often.
constexpr auto kCoordinatorCheck = std::chrono::milliseconds(100);
// A coordinator that heartbeat more recently than this is taken to be alive
// without a system call (it heartbeats every loop turn, at least every 50 ms).
constexpr uint64_t kFreshHeartbeatNs = 100'000'000;

// A slice of `deadline` no longer than kCoordinatorCheck.
Deadline slice_of(Deadline deadline) {
  const Deadline slice = Deadline::after(kCoordinatorCheck);
  return deadline.ns() < slice.ns() ? deadline : slice;
}

// Request ids are Text in the messages: an embedded NUL would truncate them.
Status check_id(std::string_view what, std::string_view id) {
  if (id.find('\0') != std::string_view::npos)
    return make_error(Errc::kInvalidArgument,
                      fmt::format("{}: request_id contains a NUL byte at position {}; request ids "
                                  "are printable ASCII without spaces",
                                  what, id.find('\0')));
  return {};
}

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
  InstanceInfo info;     // config, in the public types
  MpscRing submit_view;  // for judging sessions
  MpscProducer submit;   // this session's producer slot
  uint32_t session;
  MpscRing completions;
  messages::Limits limits;
  std::vector<SpscRing<LayerSignal>> signal_rings;
  // Per rank: this process's producer side of the signal ring, taken on
  // first use; read without a lock on every push.
  std::array<std::atomic<SpscProducer<LayerSignal>*>, kMaxTpSize> signal_producers{};
  std::array<std::unique_ptr<SpscProducer<LayerSignal>>, kMaxTpSize> owned_producers;
  std::mutex lease_mu;
  mutable CachedPeerJudge coordinator;
  std::atomic<uint64_t> dropped{0};

  Impl(ControlSegment c, MpscRing submit_ring, MpscProducer producer)
      : control(std::move(c)),
        config(control.config()),
        info(instance_info_of(config)),
        submit_view(std::move(submit_ring)),
        submit(std::move(producer)),
        session(records::session_id(submit.slot(), submit.generation())),
        completions(control.completion_ring().value()),
        limits(messages::Limits::from(config)),
        coordinator(control.locks()) {
    // Map every rank's signal ring now, so that no push ever allocates.
    for (uint32_t r = 0; r < config.tp_size; ++r)
      signal_rings.push_back(control.signal_ring<LayerSignal>(r).value());
  }

  // The coordinator lives while it holds its owner lock. A fresh heartbeat
  // spares the system call that checks it (see kFreshHeartbeatNs).
  Status alive() const {
    if (control.segment().truncated())
      return make_error(Errc::kCoordinatorGone,
                        fmt::format("the control segment of instance '{}' was truncated by "
                                    "another process; the instance is shutting down",
                                    control.instance()));
    const uint64_t beat = control.coordinator_slot().heartbeat_ns.load(std::memory_order_acquire);
    const uint64_t now = mono_now_ns();
    if (now < beat || now - beat < kFreshHeartbeatNs) return {};
    if (coordinator.lock_state() == LockState::kFree)
      return make_error(
          Errc::kCoordinatorGone,
          fmt::format("the coordinator of instance '{}' (pid {}) is gone", control.instance(),
                      read_slot(control.coordinator_slot()).owner.pid));
    return {};
  }

  // Writes one message to the submit ring, waiting for room in slices so
  // that a dead coordinator turns into an error, not a wait to the deadline.
  Status write(MessageType type, capnp::MessageBuilder& msg, Deadline deadline) {
    if (Status s = alive(); !s) return s;
    for (;;) {
      Status s = messages::write_message(submit, type, msg, slice_of(deadline));
      if (s.ok()) {
        if (Status a = alive(); !a) return a;  // e.g. the segment was truncated under the write
        notify_waiters(control.status().coordinator_doorbell);
        return {};
      }
      if (s.code() != Errc::kTimeout && s.code() != Errc::kFull && s.code() != Errc::kCorrupt)
        return s;
      if (Status a = alive(); !a) return a;
      if (deadline.passed())
        return make_error(
            s.code() == Errc::kCorrupt ? Errc::kCorrupt : Errc::kFull,
            fmt::format("the submit ring of instance '{}' {} until the deadline; "
                        "nothing was written",
                        control.instance(),
                        s.code() == Errc::kCorrupt ? "stayed corrupt" : "stayed full"));
    }
  }

  Result<SpscProducer<LayerSignal>*> signal_producer(uint32_t rank) {
    if (rank >= config.tp_size)
      return make_error(Errc::kInvalidArgument,
                        fmt::format("rank {} out of range: instance '{}' has {} ranks", rank,
                                    control.instance(), config.tp_size));
    SpscProducer<LayerSignal>* p = signal_producers[rank].load(std::memory_order_acquire);
    if (p != nullptr) return p;
    std::lock_guard lock(lease_mu);
    p = signal_producers[rank].load(std::memory_order_acquire);
    if (p != nullptr) return p;
    Result<SpscProducer<LayerSignal>> leased = signal_rings[rank].lease_producer();
    if (!leased)
      return make_error(leased.code(),
                        fmt::format("rank {}'s signal ring: {}", rank, leased.error().message));
    owned_producers[rank] = std::make_unique<SpscProducer<LayerSignal>>(std::move(leased).value());
    signal_producers[rank].store(owned_producers[rank].get(), std::memory_order_release);
    return owned_producers[rank].get();
  }

  Status push(uint32_t rank, LayerSignal s, Deadline deadline) {
    Result<SpscProducer<LayerSignal>*> ring = signal_producer(rank);
    if (!ring) return ring.error();
    if (Status a = alive(); !a) return a;
    s.session = session;
    if (!(*ring)->try_push(s)) {
      for (;;) {
        if ((*ring)->push(s, slice_of(deadline)).ok()) break;
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

  // Completions of a session that died are nobody's to read.
  bool deliverable(uint32_t of_session) const {
    if (of_session == 0 || of_session == session) return true;
    return submit_view.session_state(records::session_slot(of_session),
                                     records::session_generation(of_session)) !=
           ProducerSession::kDead;
  }
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::Client(Client&&) noexcept = default;
Client& Client::operator=(Client&&) noexcept = default;
Client::~Client() = default;

Result<Client> Client::attach(std::string_view instance, Deadline ready_by) {
  // The coordinator may still be starting (no segment yet, or one not yet
  // published): keep trying until the deadline. A stale segment (its
  // coordinator is gone) is refused at once: waiting would not change it.
  Result<ControlSegment> control = ControlSegment::attach_when_published(instance, ready_by);
  if (!control) {
    if (control.code() == Errc::kStale)
      return make_error(Errc::kCoordinatorGone, control.error().message);
    return control.error();
  }
  Result<MpscRing> submit = control->submit_ring();
  if (!submit) return submit.error();
  Result<MpscProducer> producer = submit->lease_producer();
  if (!producer)
    return make_error(producer.code(), fmt::format("instance '{}': cannot open a session: {}",
                                                   instance, producer.error().message));
  auto impl = std::make_unique<Impl>(std::move(control).value(), std::move(submit).value(),
                                     std::move(producer).value());
  const ControlSegment& c = impl->control;
  const bool ready = wait_until(
      c.status().state_changed, [&] { return c.state() != InstanceState::kInitialising; },
      ready_by);
  if (Status s = impl->alive(); !s) return s.error();
  if (!ready || c.state() != InstanceState::kReady)
    return make_error(Errc::kTimeout,
                      fmt::format("instance '{}' is {}, not ready, at the deadline", c.instance(),
                                  instance_state_name(static_cast<uint32_t>(c.state()))));
  // Open the session and wait for the coordinator to acknowledge it (after
  // it has withdrawn the requests of sessions that died).
  capnp::MallocMessageBuilder hello(16);
  hello.initRoot<schema::SessionHello>().setPid(self_pid());
  if (Status s = impl->write(MessageType::SESSION_HELLO, hello, ready_by); !s) return s.error();
  for (;;) {
    if (impl->submit.acknowledged()) break;
    if (Status a = impl->alive(); !a) return a.error();
    if (ready_by.passed())
      return make_error(Errc::kTimeout,
                        fmt::format("instance '{}' did not acknowledge the session before the "
                                    "deadline",
                                    c.instance()));
    wait_until(
        c.status().state_changed, [&] { return impl->submit.acknowledged(); }, slice_of(ready_by));
  }
  return Client(std::move(impl));
}

uint32_t Client::request_tag(std::string_view request_id) {
  return records::request_tag(request_id);
}

const InstanceInfo& Client::info() const {
  return impl_->info;
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
uint32_t Client::session() const {
  return impl_->session;
}
uint64_t Client::dropped_completions() const {
  return impl_->dropped.load(std::memory_order_relaxed);
}

Status Client::submit(const CacheTaskSpec& spec, Deadline deadline) {
  if (Status s = check_id("CacheTask", spec.request_id); !s) return s;
  capnp::MallocMessageBuilder msg;
  auto t = msg.initRoot<schema::CacheTask>();
  t.setRequestId(spec.request_id);
  t.setSrcBlockIds(list_of(spec.src_block_ids));
  t.setNeedPrefillTokens(spec.need_prefill_tokens);
  t.setDeadlineMs(spec.deadline_ms);
  t.setClientSubmitNs(mono_now_ns());
  if (spec.engine_slot.has_value() == spec.legacy_prefill_step.has_value())
    return make_error(Errc::kInvalidArgument,
                      fmt::format("CacheTask '{}': set exactly one of engine_slot (per-chunk mode) "
                                  "and legacy_prefill_step (legacy mode)",
                                  spec.request_id));
  if (spec.engine_slot) t.setEngineSlot(*spec.engine_slot);
  if (spec.legacy_prefill_step) t.setLegacyPrefillStep(*spec.legacy_prefill_step);
  // Where each rank's signals stand now: untagged signals from before this
  // submission belong to earlier requests (see the contract).
  auto marks = t.initSignalWatermarks(impl_->config.tp_size);
  for (uint32_t r = 0; r < impl_->config.tp_size; ++r)
    marks.set(r, impl_->signal_rings[r].header().write_index.load(std::memory_order_acquire));
  if (Status s = messages::validate(t.asReader(), impl_->limits); !s) return s;
  return impl_->write(MessageType::CACHE_TASK, msg, deadline);
}

Status Client::submit(const CacheDestSpec& spec, Deadline deadline) {
  if (Status s = check_id("CacheDest", spec.request_id); !s) return s;
  capnp::MallocMessageBuilder msg;
  auto d = msg.initRoot<schema::CacheDest>();
  d.setRequestId(spec.request_id);
  d.setDestBlockIds(list_of(spec.dest_block_ids));
  d.setProtocol(to_schema(spec.protocol));
  d.setPeerInstance(spec.peer_instance);
  d.setPeerAddress(spec.peer_address);
  d.setRdmaPorts(list_of(spec.rdma_ports));
  d.setTcpPorts(list_of(spec.tcp_ports));
  d.setDeviceIds(list_of(spec.device_ids));
  d.setErrorMessage(spec.error_message);
  d.setClientSubmitNs(mono_now_ns());
  if (Status s = messages::validate(d.asReader(), impl_->limits); !s) return s;
  return impl_->write(MessageType::CACHE_DEST, msg, deadline);
}

Status Client::submit(const SwapSpec& spec, Deadline deadline) {
  if (Status s = check_id("SwapTask", spec.request_id); !s) return s;
  capnp::MallocMessageBuilder msg;
  auto s = msg.initRoot<schema::SwapTask>();
  s.setRequestId(spec.request_id);
  s.setDirection(spec.load ? schema::SwapTask::Direction::LOAD
                           : schema::SwapTask::Direction::EVICT);
  s.setDeviceBlockIds(list_of(spec.device_block_ids));
  s.setHostBlockIds(list_of(spec.host_block_ids));
  s.setFirstLayer(spec.first_layer);
  s.setLayerCount(spec.layer_count);
  s.setDeadlineMs(spec.deadline_ms);
  if (Status v = messages::validate(s.asReader(), impl_->limits); !v) return v;
  return impl_->write(MessageType::SWAP_TASK, msg, deadline);
}

Status Client::submit(const ExpectSpec& spec, Deadline deadline) {
  if (Status s = check_id("ExpectArrival", spec.request_id); !s) return s;
  capnp::MallocMessageBuilder msg;
  auto e = msg.initRoot<schema::ExpectArrival>();
  e.setRequestId(spec.request_id);
  e.setDestBlockIds(list_of(spec.dest_block_ids));
  e.setDeadlineMs(spec.deadline_ms);
  if (Status v = messages::validate(e.asReader(), impl_->limits); !v) return v;
  // Before the declaration is on its way: prefill workers that write here
  // from now on check the ranks' claims and say what they wrote.
  for (uint32_t r = 0; r < impl_->config.tp_size; ++r)
    if (std::span<std::byte> table = impl_->control.intake_table(r); !table.empty())
      mark_intake_in_use(table);
  return impl_->write(MessageType::EXPECT_ARRIVAL, msg, deadline);
}

Status Client::submit(const ConnectSpec& spec, Deadline deadline) {
  capnp::MallocMessageBuilder msg;
  auto c = msg.initRoot<schema::ConnectTask>();
  c.setTaskId(spec.task_id);
  c.setProtocol(to_schema(spec.protocol));
  c.setPeerInstance(spec.peer_instance);
  c.setPeerAddress(spec.peer_address);
  c.setPorts(list_of(spec.ports));
  if (Status s = messages::validate(c.asReader(), impl_->limits); !s) return s;
  return impl_->write(MessageType::CONNECT_TASK, msg, deadline);
}

Status Client::register_pool(const PoolSpec& spec, Deadline deadline) {
  const PoolGeometry g = impl_->info.pool(spec.tier);
  // Checked before any fd moves: a spec the coordinator would refuse costs
  // the worker nothing.
  const auto build = [&](capnp::MallocMessageBuilder& msg, uint64_t ticket) -> Status {
    auto reg = msg.initRoot<schema::RegisterPool>();
    client::describe(spec, g, ticket, reg.initPool());
    return messages::validate(reg.asReader(), impl_->limits);
  };
  const std::vector<int> fds = client::fds_of(spec);
  {
    capnp::MallocMessageBuilder probe;
    // A stand-in ticket: the worker's comes once the fds reached it.
    if (Status s = build(probe, fds.empty() ? 0 : 1); !s) return s;
  }
  uint64_t ticket = 0;
  if (!fds.empty()) {
    if (spec.rank >= impl_->config.tp_size)
      return make_error(Errc::kInvalidArgument, fmt::format("rank {} out of range", spec.rank));
    Result<uint64_t> passed = pass_fds(impl_->control.instance(), spec.rank, fds, deadline);
    if (!passed) return passed.error();
    ticket = *passed;
  }
  capnp::MallocMessageBuilder msg;
  if (Status s = build(msg, ticket); !s) return s;
  return impl_->write(MessageType::REGISTER_POOL, msg, deadline);
}

Status Client::register_cuda_pool(uint32_t rank, PoolTier tier,
                                  std::span<const uint64_t> tensor_addresses, Deadline deadline) {
  const std::vector<uint64_t> sizes = client::tensor_sizes(impl_->info.pool(tier));
  if (tensor_addresses.size() != sizes.size())
    return make_error(Errc::kInvalidArgument,
                      fmt::format("{} tensor addresses for a pool of {} tensors ({} layers x {})",
                                  tensor_addresses.size(), sizes.size(),
                                  impl_->info.pool(tier).total_layers(),
                                  impl_->info.pool(tier).tensors_per_layer()));
  Result<kernels::ExportedPool> exported = kernels::export_device_tensors(tensor_addresses, sizes);
  if (!exported) return exported.error();
  // The exported fds are closed when `exported` goes, once the worker has
  // its duplicates.
  return register_pool(client::spec_of(rank, tier, *exported), deadline);
}

Status Client::cancel(std::string_view request_id, Deadline deadline) {
  if (Status s = check_id("Cancel", request_id); !s) return s;
  capnp::MallocMessageBuilder msg;
  auto c = msg.initRoot<schema::Cancel>();
  c.setRequestId(std::string(request_id));
  if (Status s = messages::validate(c.asReader(), impl_->limits); !s) return s;
  return impl_->write(MessageType::CANCEL, msg, deadline);
}

Status Client::own_signals(uint32_t rank) {
  Result<SpscProducer<LayerSignal>*> p = impl_->signal_producer(rank);
  return p ? Status{} : Status(p.error());
}

Status Client::push_batch(uint32_t rank, uint64_t step, std::span<const BatchSlot> slots,
                          Deadline deadline) {
  for (const BatchSlot& b : slots) {
    if (b.slot >= messages::kMaxEngineSlots)
      return make_error(Errc::kInvalidArgument,
                        fmt::format("push_batch: slot {} is out of range: slots are 0..{}; "
                                    "nothing was pushed",
                                    b.slot, messages::kMaxEngineSlots - 1));
  }
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

namespace {
Status check_layer(const InstanceConfig& c, uint32_t layer) {
  const uint32_t layers = c.num_layers + c.extra_layers;
  if (layer < layers) return {};
  return make_error(Errc::kInvalidArgument,
                    fmt::format("layer {} is out of range: the instance has {} layers; nothing "
                                "was pushed",
                                layer, layers));
}
}  // namespace

Status Client::push_layer_done(uint32_t rank, uint64_t step, uint32_t layer, Deadline deadline) {
  if (Status s = check_layer(impl_->config, layer); !s) return s;
  LayerSignal s{};
  s.kind = static_cast<uint32_t>(SignalKind::kLayerDone);
  s.step = step;
  s.layer = layer;
  return impl_->push(rank, s, deadline);
}

Status Client::push_legacy_layer_done(uint32_t rank, uint64_t step, uint32_t layer,
                                      Deadline deadline) {
  if (Status s = check_layer(impl_->config, layer); !s) return s;
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
  std::optional<SwapProgressView> load;
  for (;;) {  // the load may not have been dispatched yet
    load = swap_progress::find(table, tag);
    if (load) break;
    if (Status a = impl_->alive(); !a) return a;
    if (deadline.passed())
      return make_error(Errc::kTimeout,
                        fmt::format("no load '{}' appeared before the deadline", request_id));
    wait_until(
        table.slot_taken, [&] { return swap_progress::find(table, tag).has_value(); },
        slice_of(deadline));
  }
  if (layer < load->first_layer || layer >= load->first_layer + load->layer_count)
    return make_error(Errc::kInvalidArgument,
                      fmt::format("load '{}' covers layers [{}, {}), not layer {}", request_id,
                                  load->first_layer, load->first_layer + load->layer_count, layer));
  const uint32_t need = layer - load->first_layer + 1;
  bool moved_on = false;
  auto ready = [&] {
    for (uint32_t r = 0; r < impl_->config.tp_size; ++r) {
      if (rank && r != *rank) continue;
      const std::optional<uint32_t> done = swap_progress::layers_done(table, *load, r);
      if (!done) {
        moved_on = true;
        return false;
      }
      if (*done < need) return false;
    }
    return true;
  };
  auto ended_badly = [&] {
    std::optional<SwapProgressView> now = swap_progress::read(table, load->slot);
    if (now && now->generation != load->generation) moved_on = true;
    return moved_on || (now && now->state == SwapProgressState::kFailed);
  };
  SwapProgressSlot& slot = table.slots[load->slot];
  for (;;) {
    if (ready()) return {};
    if (ended_badly())
      return make_error(Errc::kAborted,
                        fmt::format("load '{}' failed or was cancelled before layer {} was "
                                    "loaded; its completion says why",
                                    request_id, layer));
    if (Status a = impl_->alive(); !a) return a;
    if (deadline.passed())
      return make_error(Errc::kTimeout,
                        fmt::format("layer {} of load '{}' was not loaded before the deadline",
                                    layer, request_id));
    wait_until(
        slot.changed, [&] { return ready() || ended_badly(); }, slice_of(deadline));
  }
}

Result<std::optional<Completion>> Client::poll() {
  std::optional<Completion> out;
  Status decoded;
  for (;;) {
    const size_t n = impl_->completions.read(
        [&](const MpscRecord& rec) {
          if (rec.defect != nullptr || rec.type != static_cast<int32_t>(MessageType::COMPLETION)) {
            decoded = make_error(
                Errc::kCorrupt,
                fmt::format("record of type {} on the completion ring{}", rec.type,
                            rec.defect != nullptr ? fmt::format(" ({})", rec.defect) : ""));
            return;
          }
          decoded = messages::with_message<schema::Completion>(
              rec.payload, [&](schema::Completion::Reader c) -> Status {
                if (!impl_->deliverable(c.getSession())) {
                  impl_->dropped.fetch_add(1, std::memory_order_relaxed);
                  return {};
                }
                const uint64_t read_ns = mono_now_ns();
                if (c.getCompletedNs() != 0 && c.getCompletedNs() <= read_ns)
                  record_shared(impl_->control.counters(kClientCounters),
                                kCompletionWrittenToEngineReadNs, read_ns - c.getCompletedNs());
                Completion x;
                x.request_id = std::string(c.getRequestId().cStr(), c.getRequestId().size());
                x.kind = static_cast<CompletionKind>(c.getKind());
                x.status = static_cast<CompletionStatus>(c.getStatus());
                x.error_rank = c.getErrorRank();
                x.message = std::string(c.getMessage().cStr(), c.getMessage().size());
                x.bytes_moved = c.getBytesMoved();
                x.submitted_ns = c.getSubmittedNs();
                x.completed_ns = c.getCompletedNs();
                x.first_copy_ns = c.getFirstCopyNs();
                x.blocks_reusable = c.getBlocksReusable();
                out = std::move(x);
                return {};
              });
        },
        1);
    if (!decoded) return decoded.error();
    // A dropped completion (its session died) makes room to look at the next.
    if (out || n == 0) break;
  }
  if (out) return out;  // completions written before a coordinator died are still delivered
  if (impl_->completions.corrupt())
    return make_error(Errc::kCorrupt,
                      fmt::format("the completion ring of instance '{}' holds records that cannot "
                                  "be delimited; the instance is shutting down",
                                  impl_->control.instance()));
  if (Status a = impl_->alive(); !a) return a.error();
  return out;
}

Result<Completion> Client::wait(Deadline deadline) {
  for (;;) {
    Result<std::optional<Completion>> c = poll();
    if (!c) return c.error();
    if (c->has_value()) return std::move(**c);
    if (deadline.passed())
      return make_error(Errc::kTimeout, "no completion arrived before the deadline");
    impl_->completions.wait_readable(slice_of(deadline));
  }
}

Result<PoolView> Client::open_pool(uint32_t rank, PoolTier tier) const {
  Result<std::string> name = find_pool(impl_->control, rank, tier);
  if (!name) return name.error();
  Result<HostPool> pool = HostPool::open(*name, nullptr);
  if (!pool) return pool.error();
  return pool_view_of(std::move(pool).value());
}

}  // namespace kvrelay

#include "kvrelay/client.h"

#include <capnp/message.h>
#include <fmt/format.h>
#include <sys/random.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <mutex>
#include <thread>

#include "client/client_impl.h"
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
#include "shm/claim_table.h"
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
  if (!producer) {
    // Every slot taken: one per attached client, so say what frees one.
    const char* remedy = producer.code() == Errc::kBusy
                             ? " (each attached client holds one until it is destroyed or its "
                               "process exits; kvrelay-dump lists the sessions)"
                             : "";
    return make_error(producer.code(), fmt::format("instance '{}': cannot open a session: {}{}",
                                                   instance, producer.error().message, remedy));
  }
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

uint64_t Client::random_nonce() {
  uint64_t n = 0;
  while (n == 0) {
    // getrandom() of 8 bytes from the initialised pool neither blocks nor
    // returns short; EINTR only before it starts.
    if (getrandom(&n, sizeof n, 0) != static_cast<ssize_t>(sizeof n)) n = 0;
  }
  return n;
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
  if (Status s = impl_->write(MessageType::CACHE_TASK, msg, deadline); !s) return s;
  // From now on the slot's untagged batch entries are this request's.
  if (spec.engine_slot)
    impl_->control.status().slot_request_tags[*spec.engine_slot].store(
        records::request_tag(spec.request_id), std::memory_order_release);
  return {};
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
  d.setRequestNonce(spec.request_nonce);
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
  e.setFromInstance(spec.from_instance);
  e.setRequestNonce(spec.request_nonce);
  if (Status v = messages::validate(e.asReader(), impl_->limits); !v) return v;
  // Before the declaration is on its way: prefill workers that write here
  // from now on check the ranks' claims and say what they wrote.
  for (uint32_t r = 0; r < impl_->config.tp_size; ++r)
    if (std::span<std::byte> table = impl_->control.claim_table(r); !table.empty())
      mark_claim_table_in_use(table);
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
    return make_error(
        Errc::kInvalidArgument,
        fmt::format("{} tensor addresses for a pool of {} tensors ({} layers x {})",
                    tensor_addresses.size(), sizes.size(), impl_->info.pool(tier).total_layers(),
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
      s.entries[i] =
          records::BatchEntry{b.slot, b.chunk_token_offset, b.chunk_len,
                              b.request_tag != 0 ? b.request_tag : impl_->slot_tag(b.slot)};
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
  SwapProgressTable& table = impl_->control.swap_progress();
  if (rank && *rank >= impl_->config.tp_size)
    return make_error(Errc::kInvalidArgument, fmt::format("rank {} out of range", *rank));
  Result<SwapProgressView> load = impl_->find_load(request_id, layer, deadline);
  if (!load) return load.error();
  const uint32_t need = layer - load->first_layer + 1;
  bool moved_on = false;
  auto ready = [&] {
    for (uint32_t r = 0; r < impl_->config.tp_size; ++r) {
      if (rank && r != *rank) continue;
      const std::optional<uint32_t> done = swap_progress::layers_done(table, *load, r);
      if (!done || *done == kReleasedLayers) {  // another load's now, or this one failed
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

Status Client::own_completions() {
  std::lock_guard lock(impl_->reader_mu);
  return impl_->own_reader();
}

Result<std::optional<Completion>> Client::poll() {
  std::lock_guard lock(impl_->reader_mu);
  if (Status s = impl_->own_reader(); !s) return s.error();
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
                if (const auto waited = stamp_age(c.getCompletedNs(), read_ns))
                  record_shared(impl_->control.counters(kClientCounters),
                                kCompletionWrittenToEngineReadNs, *waited);
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

#include "instance_view.h"

#include <fmt/format.h>

#include "instance/control_layout.h"
#include "instance/exit_reason.h"
#include "instance/pool_segment.h"
#include "instance/request_stalls.h"
#include "schemas/records.h"
#include "shm/barrier.h"
#include "shm/liveness.h"
#include "shm/mpsc_ring.h"

namespace kvrelay::dump {

namespace {

ProcessView view_process(const LivenessSlot& slot, const InstanceConfig& c, LockState lock) {
  const SlotSnapshot s = read_slot(slot);
  ProcessView v;
  v.pid = s.owner.pid;
  v.state = slot_state_name(static_cast<uint32_t>(s.state));
  v.health = peer_health_name(judge_peer(s, std::chrono::milliseconds(c.peer_timeout_ms), lock));
  const uint64_t now = mono_now_ns();
  v.heartbeat_age_ms =
      s.heartbeat_ns != 0 && now > s.heartbeat_ns ? (now - s.heartbeat_ns) / 1e6 : 0;
  v.registrations = s.registrations;
  return v;
}

RingView view_mpsc(const std::string& name, const MpscRing& ring) {
  const MpscRingHeader& h = ring.header();
  RingView v;
  v.name = name;
  v.kind = "mpsc";
  v.capacity = ring.capacity();
  v.head = h.head.load(std::memory_order_acquire);
  v.tail = h.tail.load(std::memory_order_acquire);
  v.used = v.tail >= v.head ? v.tail - v.head : 0;
  v.full_events = h.full_events.load(std::memory_order_relaxed);
  v.skipped_records = h.skipped_records.load(std::memory_order_relaxed);
  v.corrupt_records = h.corrupt_records.load(std::memory_order_relaxed);
  v.corrupt_events = h.corrupt_events.load(std::memory_order_relaxed);
  v.parked_waiters = h.not_empty.waiters.load(std::memory_order_relaxed) +
                     h.not_full.waiters.load(std::memory_order_relaxed);
  if (ring.corrupt()) {
    v.state = "corrupt";
  } else if (!ring.indices_sane()) {
    v.state = "impossible indices";
  }
  const uint64_t since = h.stalled_since_ns.load(std::memory_order_relaxed);
  const uint64_t now = mono_now_ns();
  if (since != 0 && now > since) v.stalled_ms = (now - since) / 1e6;
  const uint32_t slot = h.stalled_slot.load(std::memory_order_relaxed);
  if (slot != 0) v.stalled_by = slot - 1;
  if (std::optional<MpscConsumerHolder> reader = ring.consumer_holder()) {
    v.reader_pid = reader->pid;
    v.reader_session = reader->tag;
  }
  v.producer_slots = kMpscProducerSlots;
  for (uint32_t i = 0; i < kMpscProducerSlots; ++i) {
    const MpscProducerSlot& s = h.producers[i];
    // Judged by the slot's lock, as the ring itself does: a leaser that died
    // without releasing is not counted.
    if (ring.session_state(i, s.generation.load(std::memory_order_acquire)) ==
        ProducerSession::kAlive)
      v.producer_pids.push_back(s.pid.load(std::memory_order_relaxed));
  }
  return v;
}

template <class T>
RingView view_spsc(const std::string& name, const SpscRing<T>& ring) {
  const SpscRingHeader& h = ring.header();
  RingView v;
  v.name = name;
  v.kind = "spsc";
  v.capacity = ring.capacity();
  v.head = h.read_index.load(std::memory_order_acquire);
  v.tail = h.write_index.load(std::memory_order_acquire);
  v.used = ring.size();
  v.full_events = h.full_events.load(std::memory_order_relaxed);
  v.skipped_records = h.skipped_records.load(std::memory_order_relaxed);
  v.corrupt_events = h.corrupt_events.load(std::memory_order_relaxed);
  v.parked_waiters = h.not_empty.waiters.load(std::memory_order_relaxed) +
                     h.not_full.waiters.load(std::memory_order_relaxed);
  return v;
}

// What stops requests from flowing, as an operator would want it said.
void judge_health(InstanceView& v) {
  if (v.stale) v.problems.push_back(fmt::format("stale: {}", v.stale_reason));
  if (!v.stale && v.coordinator.health != "healthy")
    v.problems.push_back(fmt::format("coordinator is {}", v.coordinator.health));
  if (v.state != "ready") v.problems.push_back(fmt::format("instance is {}", v.state));
  for (const WorkerView& w : v.workers) {
    if (!w.ready || w.process.health != "healthy")
      v.problems.push_back(fmt::format(
          "rank {} is {}{}{}", w.rank, w.ready ? "ready but " : "not ready, ", w.process.health,
          w.exit_reason.empty() ? "" : fmt::format(" ({})", w.exit_reason)));
  }
  for (const WorkerView& w : v.workers)
    if (w.stalled != 0)
      v.problems.push_back(
          fmt::format("rank {}: {} requests not finished long after their final "
                      "chunk was signalled (see stalled requests)",
                      w.rank, w.stalled));
  const double stall_limit = v.config.stall_timeout_ms;
  for (const RingView& r : v.rings) {
    if (r.state != "ok") v.problems.push_back(fmt::format("ring {}: {}", r.name, r.state));
    if (r.stalled_ms > stall_limit)
      v.problems.push_back(fmt::format(
          "ring {}: blocked for {:.0f} ms by an uncommitted record{}", r.name, r.stalled_ms,
          r.stalled_by >= 0 ? fmt::format(" of live producer slot {} (stopped?)", r.stalled_by)
                            : ""));
  }
  if (const RingView* submit = submit_ring_of(v);
      submit != nullptr && submit->producer_pids.size() >= submit->producer_slots)
    v.problems.push_back(fmt::format(
        "every engine session is taken ({} of {}): the next client cannot attach until one "
        "detaches or its process exits",
        submit->producer_pids.size(), submit->producer_slots));
  v.health = v.problems.empty() ? "healthy" : "unhealthy";
}

}  // namespace

uint64_t CountersView::value(const std::string& label) const {
  for (const auto& [l, v] : counters)
    if (l == label) return v;
  return 0;
}

const RingView* submit_ring_of(const InstanceView& v) {
  for (const RingView& r : v.rings)
    if (r.name == "submit") return &r;
  return nullptr;
}

CountersView view_counters(const CountersBlock& block) {
  CountersView v;
  const CountersSnapshot s = snapshot_counters(block);
  v.counters = s.counters;
  for (const HistogramSnapshot& h : s.histograms) {
    const Quantiles q = quantiles_of(h);
    HistogramView hv{h.unit, h.count, q.p50, q.p90, q.p99, q.p999, q.max};
    v.histograms.emplace_back(h.label, hv);
  }
  return v;
}

InstanceView snapshot(const ControlSegment& control) {
  InstanceView v;
  const SegmentHeader& h = control.header();
  const InstanceConfig& c = control.config();
  v.name = control.instance();
  v.layout_version = h.preamble.layout_version;
  v.epoch = control.epoch();
  v.state = instance_state_name(static_cast<uint32_t>(control.state()));
  v.segment_bytes = control.segment().size();
  const CreatorStatus creator = creator_status(h.preamble, control.locks());
  v.stale = !creator.alive();
  v.stale_reason = v.stale ? creator.describe() : "";
  v.coordinator = view_process(control.coordinator_slot(), c, control.coordinator_liveness());
  v.config = c;
  v.coordinator_counters = view_counters(control.counters(kCoordinatorCounters));
  v.coordinator_doorbell_wakes =
      control.status().coordinator_doorbell.wake_calls.load(std::memory_order_relaxed);
  v.client_counters = view_counters(control.counters(kClientCounters));
  for (uint32_t r = 0; r < c.tp_size; ++r) {
    WorkerView w;
    w.rank = r;
    w.process = view_process(control.worker_slot(r), c, control.rank_liveness(r));
    w.ready = control.status().ready_flags[r].load(std::memory_order_acquire) == 1;
    w.exit_reason = read_exit_reason(control.status(), r);
    // The board before the counters: the worker mirrors its stalled count
    // before it publishes a listing (worker.cpp), so a listing read here
    // always finds its count among the counters read after it.
    if (auto board = request_stalls::read(control.request_stalls().ranks[r])) {
      const uint64_t now = mono_now_ns();
      w.stalled = board->stalled;
      for (const StallRecord& s : board->shown) {
        const auto reason = static_cast<StallReason>(s.reason);
        w.stalls.push_back(
            StallView{request_stalls::text_of(s.request_id), s.slot, stall_reason_name(reason),
                      stall_reason_text(reason),
                      now > s.since_ns ? static_cast<double>(now - s.since_ns) / 1e9 : 0.0,
                      s.in_flight, request_stalls::text_of(s.peer)});
      }
    }
    w.counters = view_counters(control.counters(worker_counters_index(r)));
    for (PoolTier tier : {PoolTier::kDevice, PoolTier::kHost}) {
      PoolEntryView p;
      p.tier = tier == PoolTier::kDevice ? "device" : "host";
      if (Result<PublishedPool> pub = find_published_pool(control, r, tier)) {
        static const char* const kLocations[] = {"host-segment", "cuda-ipc", "cuda-vmm", "host-fd"};
        p.location = kLocations[static_cast<uint32_t>(pub->location)];
        p.name = pub->name;
        p.bytes = pub->bytes;
        p.device_id = pub->device_id;
      }
      if (!p.location.empty() || tier == PoolTier::kDevice) w.pools.push_back(std::move(p));
    }
    w.device_signal_word =
        control.status().device_signals[r].layers.load(std::memory_order_relaxed);
    w.doorbell_wakes =
        control.status().worker_doorbell[r].wake_calls.load(std::memory_order_relaxed);
    v.workers.push_back(std::move(w));
  }
  if (auto ring = control.submit_ring()) v.rings.push_back(view_mpsc("submit", *ring));
  if (auto ring = control.completion_ring()) v.rings.push_back(view_mpsc("completion", *ring));
  for (uint32_t r = 0; r < c.tp_size; ++r) {
    if (auto ring = control.task_ring(r))
      v.rings.push_back(view_mpsc("task[" + std::to_string(r) + "]", *ring));
    if (auto ring = control.signal_ring<records::LayerSignal>(r))
      v.rings.push_back(view_spsc("signal[" + std::to_string(r) + "]", *ring));
    if (auto ring = control.report_ring<records::WorkerReport>(r))
      v.rings.push_back(view_spsc("report[" + std::to_string(r) + "]", *ring));
    if (auto ring = control.landed_ring(r))  // decode instances
      v.rings.push_back(view_mpsc("landed[" + std::to_string(r) + "]", *ring));
  }
  const BarrierSnapshot b = Barrier(control.barrier()).snapshot();
  v.barrier = BarrierView{b.generation,       b.parties,         b.arrived,
                          b.rounds_completed, b.rounds_poisoned, b.timeouts};
  judge_health(v);
  return v;
}

}  // namespace kvrelay::dump

// The insides of a Client (kvrelay/client.h): the instance's mapping, this
// session's producer slot, the signal rings' producers, and the GPU side of
// signals and waits. Internal to the client library; client.cpp and
// device_signals.cpp implement Client over it.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "client/views.h"
#include "instance/control_segment.h"
#include "instance/swap_progress.h"
#include "kernels/host_pinning.h"
#include "kernels/stream_marks.h"
#include "kernels/stream_signals.h"
#include "kvrelay/client.h"
#include "schemas/message_ring.h"
#include "schemas/records.h"
#include "schemas/validate.h"
#include "shm/clock.h"
#include "shm/liveness.h"
#include "shm/mpsc_ring.h"
#include "shm/spsc_ring.h"

namespace kvrelay {

using records::LayerSignal;

// Every waiting call looks at the coordinator at least this often.
inline constexpr auto kCoordinatorCheck = std::chrono::milliseconds(100);
// A coordinator that heartbeat more recently than this is taken to be alive
// without a system call (it heartbeats every loop turn, at least every 50 ms).
inline constexpr uint64_t kFreshHeartbeatNs = 100'000'000;

// A slice of `deadline` no longer than kCoordinatorCheck.
inline Deadline slice_of(Deadline deadline) {
  const Deadline slice = Deadline::after(kCoordinatorCheck);
  return deadline.ns() < slice.ns() ? deadline : slice;
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
    if (coordinator.lock_state() == LockState::kFree) {
      release_device_waits();
      return make_error(
          Errc::kCoordinatorGone,
          fmt::format("the coordinator of instance '{}' (pid {}) is gone", control.instance(),
                      read_slot(control.coordinator_slot()).owner.pid));
    }
    return {};
  }

  // The coordinator is gone and nobody will end its loads: GPU streams of
  // this process waiting on one are released, as at a failure (once).
  void release_device_waits() const {
    if (!device_waits_used.load(std::memory_order_acquire) ||
        device_waits_released.exchange(true, std::memory_order_acq_rel))
      return;
    SwapProgressTable& table = control.swap_progress();
    for (uint32_t slot = 0; slot < kSwapProgressSlots; ++slot) {
      std::optional<SwapProgressView> v = swap_progress::read(table, slot);
      if (v && v->state == SwapProgressState::kLoading) swap_progress::end(table, slot, false);
    }
  }

  // Writes one message to the submit ring, waiting for room in slices so
  // that a dead coordinator turns into an error, not a wait to the deadline.
  Status write(schema::MessageType type, capnp::MessageBuilder& msg, Deadline deadline) {
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
    // A layer's signal carries when it was pushed (the worker times its
    // read against it); restamped before each try, so a full ring's wait
    // is not counted as the hop.
    const bool stamped = records::carries_push_stamp(s.kind);
    if (stamped) s.pushed_ns = mono_now_ns();
    if (!(*ring)->try_push(s)) {
      for (;;) {
        if (stamped) s.pushed_ns = mono_now_ns();
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

  // The load `request_id`, which must cover `layer` (it may not have been
  // dispatched yet: waits for it until `deadline`).
  Result<SwapProgressView> find_load(std::string_view request_id, uint32_t layer,
                                     Deadline deadline) {
    const uint32_t tag = records::request_tag(request_id);
    SwapProgressTable& table = control.swap_progress();
    for (;;) {
      if (std::optional<SwapProgressView> load = swap_progress::find(table, tag)) {
        if (layer < load->first_layer || layer >= load->first_layer + load->layer_count)
          return make_error(
              Errc::kInvalidArgument,
              fmt::format("load '{}' covers layers [{}, {}), not layer {}", request_id,
                          load->first_layer, load->first_layer + load->layer_count, layer));
        return *load;
      }
      if (Status a = alive(); !a) return a.error();
      if (deadline.passed())
        return make_error(Errc::kTimeout,
                          fmt::format("no load '{}' appeared before the deadline", request_id));
      wait_until(
          table.slot_taken, [&] { return swap_progress::find(table, tag).has_value(); },
          slice_of(deadline));
    }
  }

  // GPU-written layer signals, per rank: this process's writer, and the
  // count its stream reaches once every step announced so far is signalled.
  std::mutex device_mu;
  // The pages the GPU reaches (the ranks' signal words and the swap
  // progress table), pinned as one range at the first device use, so that
  // the pins below fall inside it and share it: CUDA registers a page once
  // per process, and the two may share a page. Declared first, unpinned last.
  std::optional<kernels::PinnedHostRange> pinned_shared;
  Status pin_shared_pages();  // under device_mu
  std::array<std::unique_ptr<kernels::LayerSignalWriter>, kMaxTpSize> device_writers;
  std::array<uint64_t, kMaxTpSize> device_tally{};
  // The swap progress table, pinned and mapped for stream waits (first use).
  std::optional<kernels::PinnedHostRange> pinned_progress;
  // What the device side enqueued on the engine's streams (signals, waits),
  // marked with events of its own, so that teardown knows whether it may
  // still run without touching streams the engine may have destroyed.
  std::unique_ptr<kernels::StreamMarks> stream_marks = std::make_unique<kernels::StreamMarks>();
  // Before anything of the device side goes (device_signals.cpp): the work
  // it enqueued must be done, or it is kept.
  void retire_device_side();
  ~Impl() { retire_device_side(); }
  std::atomic<bool> device_waits_used{false};
  mutable std::atomic<bool> device_waits_released{false};

  // The completion ring's consumer lease, taken by this session's first
  // poll/wait (or own_completions); reader_mu serialises the reads.
  std::mutex reader_mu;
  std::optional<MpscConsumerLease> reader;

  // Under reader_mu. kBusy, naming the reader, when another live process
  // (or another Client of this one) reads the instance's completions.
  Status own_reader() {
    if (reader) return {};
    Result<MpscConsumerLease> lease = completions.lease_consumer(session);
    if (!lease)
      return make_error(
          Errc::kBusy,
          fmt::format("the completions of instance '{}' are already read: {}. kvrelay delivers "
                      "each completion once, to one reader per instance (the engine's "
                      "scheduler); read them in one process, or run one instance per "
                      "data-parallel group. Any process may still submit",
                      control.instance(), lease.error().message));
    reader.emplace(std::move(lease).value());
    return {};
  }

  // The request the slot was given last (0: none yet): what an untagged
  // batch entry of the slot is stamped with (instance_status.h).
  uint32_t slot_tag(uint32_t slot) const {
    return control.status().slot_request_tags[slot].load(std::memory_order_acquire);
  }

  // Completions of a session that died are nobody's to read.
  bool deliverable(uint32_t of_session) const {
    if (of_session == 0 || of_session == session) return true;
    return submit_view.session_state(records::session_slot(of_session),
                                     records::session_generation(of_session)) !=
           ProducerSession::kDead;
  }
};

}  // namespace kvrelay

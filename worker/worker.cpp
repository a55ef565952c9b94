#include "worker/worker.h"

#include <fmt/format.h>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <deque>
#include <memory>
#include <thread>

#include "schemas/codec.h"
#include "schemas/records.h"
#include "shm/barrier.h"
#include "shm/control_segment.h"
#include "shm/counters.h"
#include "shm/liveness.h"
#include "shm/names.h"
#include "shm/pool_segment.h"
#include "shm/process_logging.h"
#include "worker/host_destination.h"
#include "worker/send_scheduler.h"
#include "worker/swap_engine.h"
#include "worker/worker_counters.h"

namespace kvrelay::worker {

namespace {

using namespace std::chrono_literals;
using records::LayerSignal;
using records::ReportKind;
using records::WorkerReport;

volatile sig_atomic_t g_stop = 0;
void on_stop_signal(int) {
  g_stop = 1;
}

// Opens this rank's pool of `tier` if a compatible one exists (a restarted
// worker keeps the engine's KV data), else creates it; then publishes it.
Result<std::unique_ptr<HostPool>> open_or_create_pool(const ControlSegment& control, uint32_t rank,
                                                      PoolTier tier) {
  const PoolGeometry geometry = PoolGeometry::from(control.config(), tier);
  const std::string name =
      pool_segment_name(control.instance(), tier == PoolTier::kHost ? "host" : "pool", rank);
  Result<HostPool> pool = HostPool::open(name, &geometry);
  if (pool) {
    spdlog::info("rank {}: reusing {} pool /{} ({} MiB)", rank,
                 tier == PoolTier::kHost ? "host" : "device", name, pool->bytes() >> 20);
  } else {
    if (pool.code() != Errc::kNotFound) {
      spdlog::warn("rank {}: replacing pool /{}: {}", rank, name, pool.error().message);
      (void)SharedSegment::unlink(name);
    }
    pool = HostPool::create(name, rank, tier, geometry);
    if (!pool) return pool.error();
    spdlog::info("rank {}: created {} pool /{} ({} MiB)", rank,
                 tier == PoolTier::kHost ? "host" : "device", name, pool->bytes() >> 20);
  }
  publish_pool(control, rank, tier, name, pool->bytes(), true);
  return std::make_unique<HostPool>(std::move(pool).value());
}

class Worker {
 public:
  Worker(ControlSegment control, uint32_t rank)
      : control_(std::move(control)),
        rank_(rank),
        config_(control_.config()),
        slot_(control_.worker_slot(rank)),
        counters_(control_.counters(worker_counters_index(rank))),
        task_ring_(control_.task_ring(rank).value()),
        signal_ring_(control_.signal_ring<LayerSignal>(rank).value()),
        report_ring_(control_.report_ring<WorkerReport>(rank).value()),
        doorbell_(control_.status().worker_doorbell[rank]),
        coordinator_doorbell_(control_.status().coordinator_doorbell) {
    task_ring_.set_stall_timeout(std::chrono::milliseconds(config_.stall_timeout_ms));
  }

  Status set_up() {
    std::vector<std::string_view> labels(std::begin(kWorkerCounterLabels),
                                         std::end(kWorkerCounterLabels));
    define_counters(counters_, labels,
                    {{"signal_to_copy_done", "ns"},
                     {"layer_copy_time", "ns"},
                     {"layer_copy_bytes", "bytes"},
                     {"layer_copy_rate", "MB/s"}});
    register_self(slot_, SlotState::kStarting);
    Result<std::unique_ptr<HostPool>> device =
        open_or_create_pool(control_, rank_, PoolTier::kDevice);
    if (!device) return device.error();
    device_pool_ = std::move(device).value();
    if (config_.host_blocks > 0) {
      Result<std::unique_ptr<HostPool>> host =
          open_or_create_pool(control_, rank_, PoolTier::kHost);
      if (!host) return host.error();
      host_pool_ = std::move(host).value();
    }
    resolver_ = std::make_unique<HostDestinationResolver>(rank_, *device_pool_);
    start_swap_engine();
    scheduler_ = std::make_unique<SendScheduler>(
        rank_, device_pool_->geometry(), *resolver_,
        [this](uint64_t handle, ReportKind kind, uint64_t bytes, const std::string& message,
               uint64_t first_copy_ns) { report(handle, kind, bytes, message, first_copy_ns); });
    install_latency_observer();
    return {};
  }

  // Lines up with the other ranks, unless the instance is already serving
  // (a restarted worker joins a running instance directly).
  Status line_up() {
    Barrier barrier(control_.barrier());
    while (control_.state() == InstanceState::kInitialising) {
      heartbeat(slot_);
      const BarrierResult r = barrier.wait(Deadline::after(200ms));
      if (r == BarrierResult::kOk) break;
      if (g_stop != 0) return make_error(Errc::kAborted, "stopped while lining up");
      if (Status s = coordinator_alive(); !s) return s;
      // kTimeout / kAborted (a rank died and the barrier was re-armed): try again.
    }
    set_state(slot_, SlotState::kReady);
    notify_waiters(coordinator_doorbell_);
    spdlog::info("rank {}: ready", rank_);
    return {};
  }

  int serve() {
    uint64_t next_check = 0;
    while (g_stop == 0 && !shutdown_) {
      heartbeat(slot_);
      bool busy = drain_signals();
      busy = drain_tasks() || busy;
      drain_swap_reports();
      flush_reports();
      mirror_counters();
      const uint64_t now = mono_now_ns();
      if (now >= next_check) {
        next_check = now + 100'000'000ULL;
        if (Status s = coordinator_alive(); !s) {
          if (control_.state() == InstanceState::kDead) {
            spdlog::info("rank {}: {}; exiting", rank_, s.error().message);
          } else {
            spdlog::warn("rank {}: {}; exiting", rank_, s.error().message);
          }
          set_state(slot_, SlotState::kExiting);
          return 0;
        }
      }
      if (!busy) {
        wait_until(
            doorbell_,
            [&] {
              return task_ring_.readable() || signal_ring_.size() != 0 ||
                     (swap_ && swap_->has_reports()) || g_stop != 0;
            },
            Deadline::after(50ms));
      }
    }
    spdlog::info("rank {}: {}; exiting", rank_,
                 shutdown_ ? "instance shutting down" : "stopped by signal");
    flush_reports();
    set_state(slot_, SlotState::kExiting);
    release_slot(slot_);
    return 0;
  }

 private:
  Status coordinator_alive() {
    if (control_.state() == InstanceState::kDead)
      return make_error(Errc::kAborted, "the instance was shut down");
    const SlotSnapshot c = read_slot(control_.coordinator_slot());
    if (c.state != SlotState::kEmpty &&
        judge_peer(c, std::chrono::milliseconds(config_.peer_timeout_ms)) == PeerHealth::kDead)
      return make_error(Errc::kAborted, fmt::format("coordinator pid {} is gone", c.owner.pid));
    return {};
  }

  bool drain_tasks() {
    const size_t n = task_ring_.read(
        [&](int32_t type, std::span<const std::byte> payload) {
          CounterWriter(counters_).add(kTasks);
          if (type != static_cast<int32_t>(schema::MessageType::WORKER_TASK)) {
            spdlog::error("rank {}: unexpected record type {} on the task ring", rank_, type);
            return;
          }
          Status s = messages::with_message<schema::WorkerTask>(
              payload, [&](schema::WorkerTask::Reader t) -> Status { return handle(t); });
          if (!s) spdlog::error("rank {}: task refused: {}", rank_, s.error().message);
        },
        64);
    return n > 0;
  }

  Status handle(schema::WorkerTask::Reader t) {
    const uint64_t h = t.getHandle();
    switch (t.which()) {
      case schema::WorkerTask::BIND:
        // Every signal the engine pushed before it submitted this task is in
        // the signal ring by now (the task reached us through the engine's
        // submit, the coordinator and our task ring, each a release/acquire
        // handoff). Apply them first, so that the slot's previous request
        // sees the end of its prefill before the slot changes hands.
        while (drain_signals()) {
        }
        scheduler_->on_bind(h, t.getBind());
        break;
      case schema::WorkerTask::DEST: scheduler_->on_dest(h, t.getDest()); break;
      case schema::WorkerTask::CANCEL:
        if (!(swap_ && swap_->cancel(h))) scheduler_->on_cancel(h);
        break;
      case schema::WorkerTask::CONNECT: {
        Status s = resolver_->check_connect(t.getConnect());
        report(h, s ? ReportKind::kConnected : ReportKind::kConnectFailed, 0,
               s ? "" : s.error().message);
        break;
      }
      case schema::WorkerTask::SWAP:
        if (swap_) {
          swap_->submit(h, t.getSwap(), t.getProgressSlot());
        } else {
          report(h, ReportKind::kFailed, 0,
                 "this instance has no host tier (--num-host-blocks is 0)");
        }
        break;
      case schema::WorkerTask::REGISTER_POOL: register_pool(h, t.getRegisterPool()); break;
      case schema::WorkerTask::SHUTDOWN: shutdown_ = true; break;
    }
    return {};
  }

  void start_swap_engine() {
    swap_.reset();
    if (host_pool_)
      swap_ = std::make_unique<SwapEngine>(rank_, *device_pool_, *host_pool_,
                                           &control_.swap_progress(), doorbell_);
  }

  void drain_swap_reports() {
    if (!swap_ || !swap_->has_reports()) return;
    for (const SwapReport& r : swap_->take_reports())
      report(r.handle, r.kind, r.bytes, r.message, r.first_copy_ns);
  }

  void install_latency_observer() {
    scheduler_->set_latency_observer(
        [this](uint32_t, uint64_t to_done, uint64_t copy, uint64_t bytes) {
          CounterWriter w(counters_);
          w.record(kSignalToCopyDoneNs, to_done);
          w.record(kLayerCopyNs, copy);
          w.record(kLayerCopyBytes, bytes);
          if (copy > 0) w.record(kLayerCopyMBps, bytes * 1000 / copy);
        });
  }

  void register_pool(uint64_t handle, schema::PoolDescriptor::Reader d) {
    if (d.getLocation() != schema::PoolDescriptor::Location::HOST_SEGMENT) {
      report(handle, ReportKind::kPoolRejected, 0, "CUDA IPC pools need a CUDA build and a GPU");
      return;
    }
    const PoolTier tier =
        d.getTier() == schema::PoolDescriptor::Tier::HOST ? PoolTier::kHost : PoolTier::kDevice;
    if (scheduler_->live_requests() != 0 || (swap_ && swap_->pending() != 0)) {
      report(handle, ReportKind::kPoolRejected, 0,
             fmt::format("{} requests are in flight; register pools before sending",
                         scheduler_->live_requests()));
      return;
    }
    const PoolGeometry expected = PoolGeometry::from(config_, tier);
    Result<HostPool> pool = HostPool::open(d.getSegmentName().cStr(), &expected);
    if (!pool) {
      report(handle, ReportKind::kPoolRejected, 0, pool.error().message);
      return;
    }
    publish_pool(control_, rank_, tier, pool->name(), pool->bytes(), false);
    auto owned = std::make_unique<HostPool>(std::move(pool).value());
    if (tier == PoolTier::kDevice) {
      resolver_ = std::make_unique<HostDestinationResolver>(rank_, *owned);
      scheduler_ = std::make_unique<SendScheduler>(
          rank_, owned->geometry(), *resolver_,
          [this](uint64_t h, ReportKind kind, uint64_t bytes, const std::string& message,
                 uint64_t first_copy_ns) { report(h, kind, bytes, message, first_copy_ns); });
      swap_.reset();  // it holds the old pools
      device_pool_ = std::move(owned);
      install_latency_observer();
    } else {
      swap_.reset();
      host_pool_ = std::move(owned);
    }
    start_swap_engine();
    report(handle, ReportKind::kPoolRegistered, 0, "");
  }

  bool drain_signals() {
    LayerSignal s{};
    size_t n = 0;
    while (n < 256 && signal_ring_.try_pop(s)) {
      scheduler_->on_signal(s);
      ++n;
    }
    return n > 0;
  }

  void report(uint64_t handle, ReportKind kind, uint64_t bytes, const std::string& message,
              uint64_t first_copy_ns = 0) {
    WorkerReport r{};
    r.first_copy_ns = first_copy_ns;
    r.handle = handle;
    r.kind = static_cast<uint32_t>(kind);
    r.rank = rank_;
    r.bytes_moved = bytes;
    r.set_message(message);
    pending_reports_.push_back(r);
    flush_reports();
  }

  void flush_reports() {
    bool pushed = false;
    while (!pending_reports_.empty() && report_ring_.try_push(pending_reports_.front())) {
      pending_reports_.pop_front();
      pushed = true;
    }
    if (!pending_reports_.empty()) CounterWriter(counters_).add(kReportsDelayed);
    if (pushed) notify_waiters(coordinator_doorbell_);
  }

  void mirror_counters() {
    const SchedulerCounters& c = scheduler_->counters();
    auto set = [&](uint32_t id, uint64_t v) {
      counters_.values[id].store(v, std::memory_order_relaxed);
    };
    set(kSignals, c.signals);
    set(kBadSignals, c.bad_signals);
    set(kLayerCopies, c.layer_copies);
    set(kBytesCopied, c.bytes);
    set(kRequestsFinished, c.finished);
    set(kRequestsFailed, c.failed);
    set(kRequestsCancelled, c.cancelled);
  }

  ControlSegment control_;
  uint32_t rank_;
  InstanceConfig config_;
  LivenessSlot& slot_;
  CountersBlock& counters_;
  MpscRing task_ring_;
  SpscRing<LayerSignal> signal_ring_;
  SpscRing<WorkerReport> report_ring_;
  WaitEvent& doorbell_;
  WaitEvent& coordinator_doorbell_;
  std::unique_ptr<HostPool> device_pool_;
  std::unique_ptr<HostPool> host_pool_;
  std::unique_ptr<HostDestinationResolver> resolver_;
  std::unique_ptr<SendScheduler> scheduler_;
  std::unique_ptr<SwapEngine> swap_;  // after the pools: it refers to them
  std::deque<WorkerReport> pending_reports_;
  bool shutdown_ = false;
};

Result<ControlSegment> attach_with_retry(const WorkerOptions& o) {
  const Deadline until = Deadline::after(o.attach_timeout);
  for (;;) {
    Result<ControlSegment> c = ControlSegment::attach(o.instance);
    if (c) return c;
    const bool transient =
        c.code() == Errc::kNotFound || c.code() == Errc::kNotReady || c.code() == Errc::kStale;
    if (!transient || until.passed()) return c;
    std::this_thread::sleep_for(50ms);
  }
}

}  // namespace

int run_worker(const WorkerOptions& o) {
  if (Status s = setup_logging(fmt::format("worker-rank{}", o.rank), o.log_dir, o.log_level); !s) {
    fmt::print(stderr, "kvrelay-worker: {}\n", s.error().message);
    return 2;
  }
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);

  Result<ControlSegment> control = attach_with_retry(o);
  if (!control) {
    spdlog::error("cannot attach to instance '{}': {}", o.instance, control.error().message);
    return 1;
  }
  if (o.rank >= control->config().tp_size) {
    spdlog::error("rank {} does not exist: instance '{}' has {} ranks", o.rank, o.instance,
                  control->config().tp_size);
    return 2;
  }
  const SlotSnapshot previous = read_slot(control->worker_slot(o.rank));
  if (previous.owner.pid != self_pid() &&
      judge_peer(previous, std::chrono::milliseconds(control->config().peer_timeout_ms)) ==
          PeerHealth::kHealthy &&
      previous.state != SlotState::kExiting) {
    spdlog::error("rank {} of instance '{}' is already served by pid {}", o.rank, o.instance,
                  previous.owner.pid);
    return 1;
  }
  Worker worker(std::move(control).value(), o.rank);
  if (Status s = worker.set_up(); !s) {
    spdlog::error("rank {}: set-up failed: {}", o.rank, s.error().message);
    return 1;
  }
  if (Status s = worker.line_up(); !s) {
    spdlog::warn("rank {}: {}", o.rank, s.error().message);
    return 0;
  }
  return worker.serve();
}

}  // namespace kvrelay::worker

#include "worker/worker.h"

#include <fmt/format.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <deque>
#include <memory>
#include <thread>

#include "instance/control_segment.h"
#include "instance/exit_reason.h"
#include "instance/pool_segment.h"
#include "schemas/codec.h"
#include "schemas/records.h"
#include "shm/barrier.h"
#include "shm/counters.h"
#include "shm/cpu_affinity.h"
#include "shm/fault_point.h"
#include "shm/liveness.h"
#include "shm/process_logging.h"
#include "shm/scheduler_slice.h"
#include "worker/data_plane.h"
#include "worker/device_signal_watch.h"
#include "worker/report_outbox.h"
#include "worker/stall_watch.h"
#include "worker/task_dispatch.h"
#include "worker/transport_options.h"
#include "worker/worker_counters.h"

namespace kvrelay::worker {

namespace {

using namespace std::chrono_literals;
using records::LayerSignal;
using records::ReportKind;
using records::WorkerReport;

// Exit codes (the coordinator's supervisor reads them: coordinator/supervisor.h).
constexpr int kExitError = 1;
constexpr int kExitRefused = 3;   // cannot start here; restarting will not help
constexpr int kExitUnusable = 4;  // our rings are unusable; the coordinator resets them

volatile sig_atomic_t g_stop = 0;
void on_stop_signal(int) {
  g_stop = 1;
}

// Leaves why we give up where the coordinator reads it, then returns `code`.
int give_up(const ControlSegment& control, uint32_t rank, int code, const std::string& why) {
  spdlog::error("rank {}: {}", rank, why);
  write_exit_reason(control.status(), rank, why);
  return code;
}

class Worker {
 public:
  Worker(ControlSegment control, uint32_t rank, SpscProducer<WorkerReport> reports,
         NetworkOptions network)
      : control_(std::move(control)),
        rank_(rank),
        network_(std::move(network)),
        config_(control_.config()),
        slot_(control_.worker_slot(rank)),
        counters_(control_.counters(worker_counters_index(rank))),
        task_ring_(control_.task_ring(rank).value()),
        signal_ring_(control_.signal_ring<LayerSignal>(rank).value()),
        reports_(std::move(reports), rank, control_.status().coordinator_doorbell,
                 control_.status().finished_report_gates, counters_, kReportsDelayed,
                 kReportsWithoutWake),
        doorbell_(control_.status().worker_doorbell[rank]),
        device_signals_(control_.status().device_signals[rank].layers),
        coordinator_doorbell_(control_.status().coordinator_doorbell),
        coordinator_(control_.locks()),
        stalls_(rank, std::chrono::milliseconds(config_.stall_report_ms),
                control_.request_stalls().ranks[rank]) {
    task_ring_.set_stall_timeout(std::chrono::milliseconds(config_.stall_timeout_ms));
  }

  Status set_up() {
    std::vector<std::string_view> labels(std::begin(kWorkerCounterLabels),
                                         std::end(kWorkerCounterLabels));
    define_counters(counters_, labels,
                    {std::begin(kWorkerHistogramLabels), std::end(kWorkerHistogramLabels)});
    register_self(slot_, SlotState::kStarting);
    DataPlane::Hooks hooks;
    hooks.report = [this](uint64_t handle, ReportKind kind, uint64_t bytes,
                          const std::string& message, uint64_t first_copy_ns) {
      report(handle, kind, bytes, message, first_copy_ns);
    };
    hooks.latency = [this](uint32_t, uint64_t to_done, uint64_t copy, uint64_t bytes) {
      CounterWriter w(counters_);
      w.record(kSignalToCopyDoneNs, to_done);
      w.record(kLayerCopyNs, copy);
      w.record(kLayerCopyBytes, bytes);
      if (copy > 0) w.record(kLayerCopyMBps, bytes * 1000 / copy);
    };
    hooks.hop = [this](WorkerHistogram hop, uint64_t ns) {
      CounterWriter(counters_).record(hop, ns);
    };
    Result<std::unique_ptr<DataPlane>> data =
        DataPlane::open(control_, rank_, network_, doorbell_, std::move(hooks));
    if (!data) return data.error();
    data_ = std::move(data).value();
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

  const ControlSegment& control() const { return control_; }

  int serve() {
    uint64_t next_check = 0;
    while (g_stop == 0 && !shutdown_) {
      heartbeat(slot_);
      if (!broken_.empty())
        return give_up(control_, rank_, kExitError,
                       fmt::format("cannot serve the registered pool: {}", broken_));
      bool busy = drain_signals();
      busy = drain_tasks() || busy;
      if (!broken_.empty()) continue;  // a RegisterPool left nothing to serve
      const bool serving = data_->serving();  // --pool none: not before the engine's pool
      if (serving && data_->transports().has_completions()) {
        data_->scheduler().poll_transfers();
        busy = true;
      }
      drain_swap_reports();
      if (serving) busy = data_->transports().tick() || busy;
      drain_arrivals();
      reports_.flush();
      // The watchdog's count is mirrored with its listing, so that whoever
      // sees a request listed finds it counted.
      const bool newly_stalled = serving && stalls_.check(data_->scheduler(), mono_now_ns());
      mirror_counters();
      if (newly_stalled) stalls_.publish();
      if (const LocalPool* pool = data_->truncated_pool())
        return give_up(control_, rank_, kExitUnusable,
                       fmt::format("its pool /{} was truncated by another process; exiting so "
                                   "that a new worker recreates it",
                                   pool->name()));
      if (control_.segment().truncated())
        return give_up(control_, rank_, kExitUnusable,
                       "the instance's control segment was truncated by another process");
      if (task_ring_.corrupt()) {
        return give_up(control_, rank_, kExitUnusable,
                       fmt::format("its task ring is unusable ({}); exiting so that the "
                                   "coordinator resets it",
                                   task_ring_.take_corruption().value_or("corrupt records")));
      }
      const uint64_t now = mono_now_ns();
      if (now >= next_check) {
        next_check = now + ns_of(100ms);
        if (auto what = task_ring_.take_corruption())
          spdlog::error("rank {}: task ring: {}", rank_, *what);
        if (const PoolRegistration r = data_->release_orphaned_pools(); r.broken)
          return give_up(control_, rank_, kExitError, r.message);
        if (Status s = coordinator_alive(); !s) {
          spdlog::warn("rank {}: {}; exiting", rank_, s.error().message);
          set_state(slot_, SlotState::kExiting);
          return 0;
        }
      }
      if (!busy && device_signals_.spinning(now)) {
        // The GPU writes its word without a system call: while its layers
        // keep coming, look again at once.
        cpu_relax();
      } else if (!busy) {
        const uint64_t word = device_signals_.word();
        wait_until(
            doorbell_,
            [&] {
              return task_ring_.readable() ||
                     (signal_ring_.readable() && !device_signals_.pending()) ||
                     (data_->serving() && (data_->transports().has_completions() ||
                                           data_->transports().has_arrivals())) ||
                     (data_->swap() != nullptr && data_->swap()->has_reports()) ||
                     device_signals_.word() != word || g_stop != 0;
            },
            // A step the GPU still owes layers is looked at again soon.
            device_signals_.pending() ? Deadline::after(100us) : Deadline::after(50ms));
      }
    }
    spdlog::info("rank {}: {}; exiting", rank_,
                 shutdown_ ? "instance shutting down" : "stopped by signal");
    reports_.flush();
    set_state(slot_, SlotState::kExiting);
    release_slot(slot_);
    return 0;
  }

 private:
  // Alive while it holds its owner lock: the shared state word and the pid
  // written in its slot are only input, and can be scribbled on.
  Status coordinator_alive() {
    if (coordinator_.lock_state() == LockState::kFree)
      return make_error(Errc::kAborted,
                        fmt::format("the coordinator (pid {}) is gone",
                                    read_slot(control_.coordinator_slot()).owner.pid));
    return {};
  }

  bool drain_tasks() {
    if (!broken_.empty()) return false;
    const size_t n = task_ring_.read(
        [&](const MpscRecord& rec) {
          const uint64_t read_ns = mono_now_ns();
          CounterWriter(counters_).add(kTasks);
          if (!broken_.empty()) return;  // the data plane is gone: the worker exits
          if (rec.defect != nullptr ||
              rec.type != static_cast<int32_t>(schema::MessageType::WORKER_TASK)) {
            spdlog::error("rank {}: unexpected record (type {}{}) on the task ring", rank_,
                          rec.type, rec.defect != nullptr ? fmt::format(", {}", rec.defect) : "");
            return;
          }
          Status s = messages::with_message<schema::WorkerTask>(
              rec.payload, [&](schema::WorkerTask::Reader t) -> Status {
                // The stamp is another process's: a hop is timed only when it is sane.
                if (const auto waited = stamp_age(t.getWrittenNs(), read_ns))
                  CounterWriter(counters_).record(kTaskWrittenToReadNs, *waited);
                return handle(t, read_ns);
              });
          if (!s) spdlog::error("rank {}: task refused: {}", rank_, s.error().message);
        },
        64);
    return n > 0;
  }

  Status handle(schema::WorkerTask::Reader t, uint64_t read_ns) {
    const TaskEffect effect = dispatch_task(
        t, rank_, *data_, reports_, [this] { return drain_signals(); }, read_ns);
    if (effect.shutdown) shutdown_ = true;
    if (effect.broken) broken_ = *effect.broken;
    if (effect.session_ended) device_signals_.on_session_ended(*effect.session_ended);
    return {};
  }

  void drain_swap_reports() {
    SwapEngine* swap = data_->swap();
    if (swap == nullptr || !swap->has_reports()) return;
    for (const SwapReport& r : swap->take_reports())
      report(r.handle, r.kind, r.bytes, r.message, r.first_copy_ns);
  }

  // Expected requests (tcp, ipc): arrived, failed (a write broke its
  // rules), or withdrawn (the answer to a cancel).
  void drain_arrivals() {
    if (!data_->serving() || !data_->transports().has_arrivals()) return;
    for (const ArrivalEvent& e : data_->transports().take_arrivals()) {
      switch (e.kind) {
        case ArrivalEvent::kArrived:
          time_arrival_tail(e);
          report(e.handle, ReportKind::kFinished, e.bytes, "");
          break;
        case ArrivalEvent::kFailed:
          report(e.handle, ReportKind::kFailed, e.bytes, e.message);
          break;
        case ArrivalEvent::kWithdrawn: report(e.handle, ReportKind::kCancelled, e.bytes, ""); break;
      }
    }
  }

  // The last landed record that counted for an arrived request -> its
  // report, timed as the report is written (as the send side's tail is).
  // The stamp is an ipc writer's: timed only when it is sane.
  void time_arrival_tail(const ArrivalEvent& e) {
    if (const auto waited = stamp_age(e.last_landed_ns, mono_now_ns()))
      CounterWriter(counters_).record(kLastLandedToReportNs, *waited);
  }

  // Signal records, and the layers the GPU signalled: records after a step
  // whose layers the GPU still owes wait (they are later steps').
  bool drain_signals() {
    size_t n = poll_device_signals();
    while (n < kSignalBatch && !device_signals_.pending() && signal_ring_.try_pop(signals_[n])) {
      const LayerSignal& s = signals_[n++];
      const uint64_t index = signal_ring_.consumer_position() - 1;
      time_signal_hop(s);
      if (s.kind != static_cast<uint32_t>(records::SignalKind::kDeviceLayers)) {
        // Without a pool no request is bound here: the signal moves nothing.
        if (data_->serving()) data_->scheduler().on_signal(s, index);
        continue;
      }
      device_signals_index_ = index;
      if (!device_signals_.follow(s, mono_now_ns())) {
        ++bad_device_records_;
        spdlog::warn("rank {}: a device-signalled step announces {} layers (at most {})", rank_,
                     s.count, DeviceSignalWatch::kMaxLayers);
      }
      n += poll_device_signals();
    }
    return n > 0;
  }
  // The engine's stamp on a layer's signal (records.h): timed only when it
  // is sane, like every stamp from another process.
  void time_signal_hop(const LayerSignal& s) {
    if (!records::carries_push_stamp(s.kind)) return;
    if (const auto waited = stamp_age(s.pushed_ns, mono_now_ns()))
      CounterWriter(counters_).record(kSignalWrittenToReadNs, *waited);
  }
  size_t poll_device_signals() {
    return device_signals_.poll(
        [&](const LayerSignal& s) {
          if (data_->serving()) data_->scheduler().on_signal(s, device_signals_index_);
        },
        mono_now_ns());
  }

  void report(uint64_t handle, ReportKind kind, uint64_t bytes, const std::string& message,
              uint64_t first_copy_ns = 0) {
    // Mirrored before the report goes out: once it does, the request may
    // complete, and an engine that reads the completion and then runs
    // kvrelay-dump must find it counted here too (as the coordinator does).
    mirror_counters();
    reports_.report(handle, kind, bytes, message, first_copy_ns);
    if (kind == ReportKind::kFinished) KVRELAY_FAULT_POINT("worker.finished_reported");
  }

  void mirror_counters() {
    // Nothing moves, and nothing is counted, without a pool (or before the
    // data plane exists: a report may come while it is being built).
    if (!data_ || !data_->serving()) return;
    const SchedulerCounters& c = data_->scheduler().counters();
    CounterWriter mirror(counters_);
    auto set = [&](uint32_t id, uint64_t v) { mirror.set(id, v); };
    set(kSignals, c.signals);
    set(kBadSignals, c.bad_signals + bad_device_records_);
    set(kLayerCopies, c.layer_copies);
    set(kBytesCopied, c.bytes);
    set(kRequestsFinished, c.finished);
    set(kRequestsFailed, c.failed);
    set(kRequestsCancelled, c.cancelled);
    set(kStaleSessions, c.stale_sessions + c.dropped_sessions);
    set(kStalledRequests, stalls_.found());
    set(kSignalRepairs, signal_ring_.header().corrupt_events.load(std::memory_order_relaxed) +
                            signal_ring_.header().skipped_records.load(std::memory_order_relaxed));
    data_->transports().mirror_counters(mirror);
  }

  static constexpr size_t kSignalBatch = 64;

  ControlSegment control_;
  uint32_t rank_;
  NetworkOptions network_;
  InstanceConfig config_;
  LivenessSlot& slot_;
  CountersBlock& counters_;
  MpscRing task_ring_;
  SpscRing<LayerSignal> signal_ring_;
  ReportOutbox reports_;
  WaitEvent& doorbell_;
  DeviceSignalWatch device_signals_;
  uint64_t device_signals_index_ = 0;  // the signal-ring position of the step they follow
  uint64_t bad_device_records_ = 0;
  WaitEvent& coordinator_doorbell_;
  CachedPeerJudge coordinator_;
  StallWatch stalls_;
  std::unique_ptr<DataPlane> data_;
  LayerSignal signals_[kSignalBatch] = {};
  bool shutdown_ = false;
  std::string broken_;  // why the worker cannot go on (it exits, and is restarted)
};

}  // namespace

int run_worker(const WorkerOptions& o) {
  if (Status s =
          setup_logging(fmt::format("worker-rank{}", o.rank), o.log_dir, o.log_level, o.instance);
      !s) {
    fmt::print(stderr, "kvrelay-worker: {}\n", s.error().message);
    return 2;
  }
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  // Before any thread starts: the transports' threads inherit the CPU.
  if (Status s = place_process(o.idle, o.cpus, o.rank + 1); !s) {
    spdlog::error("rank {}: {}", o.rank, s.error().message);
    return 2;
  }
  // A coordinator that started us passed on its short scheduler slice
  // (shm/scheduler_slice.h): the copies take the kernel's default, so that
  // the coordinator's wake-ups preempt them and not the other way round.
  // Refused (a seccomp filter), the coordinator could not take its slice
  // either: ours is the default already, so this is no warning.
  if (Result<Nanos> s = set_scheduler_slice(Nanos(0)); !s && s.code() != Errc::kUnsupported)
    spdlog::info("rank {}: scheduler slice left as it is: {}", o.rank, s.error().message);
  // A tcp peer that goes away is an error on its connection, never a signal
  // that takes the worker down (sends use MSG_NOSIGNAL too).
  signal(SIGPIPE, SIG_IGN);
  // Started by a coordinator, a worker leads a process group of its own (so
  // that Ctrl-C reaches only the coordinator): in a terminal that is a
  // background group, which `stty tostop` would stop at its first log line.
  signal(SIGTTOU, SIG_IGN);
  // A GPU pool in VMM chunks arrives as thousands of fds (one per 20 MiB
  // allocation): take every descriptor the hard limit allows.
  if (rlimit files{}; getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &files);
  }

  // Started before its coordinator, or before a restarted coordinator
  // replaced its dead predecessor's segment: wait for it.
  Result<ControlSegment> control = ControlSegment::attach_when_published(
      o.instance, Deadline::after(o.attach_timeout), /*wait_out_stale=*/true);
  if (!control) {
    spdlog::error("cannot attach to instance '{}': {}", o.instance, control.error().message);
    return kExitError;
  }
  if (o.rank >= control->config().tp_size) {
    spdlog::error("rank {} does not exist: instance '{}' has {} ranks", o.rank, o.instance,
                  control->config().tp_size);
    return 2;
  }
  // The rank's owner lock: one worker per rank, proven by the kernel.
  if (!control->lock_rank(o.rank))
    return give_up(
        *control, o.rank, kExitRefused,
        fmt::format("rank {} of instance '{}' is already served by a live worker (pid "
                    "{})",
                    o.rank, o.instance, read_slot(control->worker_slot(o.rank)).owner.pid));
  Result<SpscProducer<WorkerReport>> reports =
      control->report_ring<WorkerReport>(o.rank)->lease_producer();
  if (!reports)
    return give_up(*control, o.rank, kExitRefused,
                   fmt::format("its report ring: {}", reports.error().message));
  // The same checks the coordinator ran on its flags: a worker started by
  // another supervisor gets the same messages.
  NetworkOptions network = o.network;
  if (Status s = settle_transport_options(control->config(), network); !s)
    return give_up(*control, o.rank, kExitRefused, s.error().message);
  Worker worker(std::move(control).value(), o.rank, std::move(reports).value(), network);
  if (Status s = worker.set_up(); !s) {
    const bool permanent = s.code() == Errc::kPermissionDenied || s.code() == Errc::kBusy;
    return give_up(worker.control(), o.rank, permanent ? kExitRefused : kExitError,
                   fmt::format("set-up failed: {}", s.error().message));
  }
  if (Status s = worker.line_up(); !s) {
    spdlog::warn("rank {}: {}", o.rank, s.error().message);
    return 0;
  }
  return worker.serve();
}

}  // namespace kvrelay::worker

#include "coordinator/coordinator.h"

#include <fmt/format.h>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <optional>

#include "coordinator/completion_publisher.h"
#include "coordinator/coordinator_counters.h"
#include "coordinator/engine_sessions.h"
#include "coordinator/hello_gate.h"
#include "coordinator/rank_health.h"
#include "coordinator/ring_writer.h"
#include "coordinator/service_notify.h"
#include "coordinator/shared_state_guard.h"
#include "coordinator/submission_reader.h"
#include "coordinator/task_table.h"
#include "coordinator/worker_loss.h"
#include "instance/control_segment.h"
#include "instance/peer_instances.h"
#include "instance/pool_segment.h"
#include "instance/report_wake_gate.h"
#include "instance/swap_progress.h"
#include "schemas/codec.h"
#include "schemas/records.h"
#include "shm/barrier.h"
#include "shm/counters.h"
#include "shm/cpu_affinity.h"
#include "shm/liveness.h"
#include "shm/process_logging.h"
#include "shm/scheduler_slice.h"

namespace kvrelay::coordinator {

namespace {

using namespace std::chrono_literals;
using records::WorkerReport;
using schema::MessageType;

// Exit code of a coordinator that found its instance's shared state broken
// beyond repair (it failed every live request and shut down).
constexpr int kExitBroken = 4;

// Set by SIGTERM/SIGINT. The handler touches no shared memory: a segment
// truncated under us would raise SIGBUS inside it, where the truncation
// guard may not run (signals can be blocked there). The signal interrupts
// the loop's futex wait (no SA_RESTART), and the loop never sleeps longer
// than 50 ms anyway.
volatile sig_atomic_t g_stop = 0;

void on_stop_signal(int) {
  g_stop = 1;
}

RingWriter make_writer(Result<MpscRing> ring, WaitEvent* doorbell, const char* what) {
  if (!ring) throw std::runtime_error(fmt::format("{}: {}", what, ring.error().message));
  Result<MpscProducer> producer = ring->lease_producer();
  if (!producer) throw std::runtime_error(fmt::format("{}: {}", what, producer.error().message));
  return RingWriter(std::move(producer).value(), doorbell);
}

class Coordinator : public Sink, public RankHealth::Listener {
 public:
  Coordinator(const CoordinatorOptions& o, ControlSegment control)
      : options_(o),
        control_(std::move(control)),
        config_(control_.config()),
        status_(control_.status()),
        counters_(control_.counters(kCoordinatorCounters)),
        submit_(control_.submit_ring().value()),
        completions_(make_writer(control_.completion_ring(), nullptr, "completion ring")),
        publisher_(completions_, counters_, kRequestLatencyNs, [this] { mirror_counters(); }),
        sessions_(submit_),
        health_(control_, options_, *this),
        guard_(control_, counters_) {
    submit_.set_stall_timeout(std::chrono::milliseconds(config_.stall_timeout_ms));
    for (uint32_t r = 0; r < config_.tp_size; ++r) {
      tasks_.push_back(
          make_writer(control_.task_ring(r), &status_.worker_doorbell[r], "task ring"));
      reports_.push_back(control_.report_ring<WorkerReport>(r).value());
    }
    TableOptions table_options;
    table_options.default_deadline = std::chrono::milliseconds(config_.request_deadline_ms);
    // Twice the peer timeout: a rank whose network peer stalls abandons what
    // that peer holds (no ack, no payload, no grant within the peer timeout:
    // worker/net/) and confirms in time; only a rank that is itself stuck is
    // stopped.
    table_options.withdraw_timeout = std::chrono::milliseconds(2 * config_.peer_timeout_ms);
    table_options.own_instance = control_.instance();
    table_options.own_tp_size = config_.tp_size;
    table_options.peer_info = [this](std::string_view peer) { return peer_info(peer); };
    table_ = std::make_unique<TaskTable>(messages::Limits::from(config_), std::move(table_options),
                                         *this);
    std::vector<std::string_view> labels(std::begin(kCoordinatorCounterLabels),
                                         std::end(kCoordinatorCounterLabels));
    define_counters(counters_, labels,
                    {std::begin(kCoordinatorHistogramLabels), std::end(kCoordinatorHistogramLabels)});
    define_counters(control_.counters(kClientCounters), {},
                    {std::begin(kClientHistogramLabels), std::end(kClientHistogramLabels)});
  }

  // ---- Sink ----
  void to_worker(uint32_t rank, capnp::MessageBuilder& task) override {
    tasks_[rank].write(MessageType::WORKER_TASK, task);
  }

  void complete(capnp::MessageBuilder& completion) override { publisher_.publish(completion); }

  void expect_reports(uint64_t handle, uint32_t ranks) override {
    report_wake_gate::arm(status_.finished_report_gates, handle, ranks);
  }

  void observe_hop(CoordinatorHistogram hop, uint64_t ns) override {
    CounterWriter(counters_).record(hop, ns);
  }

  bool rank_unresponsive(uint32_t rank, const std::string& why) override {
    return health_.stop_rank(rank, why);
  }

  uint32_t begin_load_progress(uint64_t handle, const std::string& id, uint32_t first_layer,
                               uint32_t layer_count, uint32_t& generation) override {
    const uint32_t slot =
        swap_progress::begin(control_.swap_progress(), handle, records::request_tag(id),
                             first_layer, layer_count, generation);
    if (slot == kNoProgressSlot) {
      spdlog::warn("no swap progress slot free for '{}': its per-layer waits will not be served",
                   id);
      return kNoProgressSlot;
    }
    return slot;
  }

  void end_load_progress(uint32_t slot, bool finished) override {
    swap_progress::end(control_.swap_progress(), slot, finished);
  }

  // ---- RankHealth::Listener ----
  void rank_lost(uint32_t rank, const std::string& reason, uint64_t now) override {
    CounterWriter(counters_).add(kWorkersLost);
    drain_reports(now);  // what it reported before dying still counts
    table_->on_rank_lost(rank, reason, now);
    // Nothing addressed to the dead worker is still wanted: its requests have
    // failed, and the next worker starts from nothing.
    const LeftBehind left = clear_lost_rank(control_, rank, tasks_[rank]);
    if (left.anything())
      spdlog::info("rank {}: dropped {} queued tasks, {} bytes of its task ring and {} signals",
                   rank, left.queued_tasks, left.ring_bytes, left.signals);
  }

  void rank_up(uint32_t rank) override {
    CounterWriter(counters_).add(kWorkerRestarts);
    table_->set_rank_up(rank);
  }

  int run() {
    register_self(control_.coordinator_slot(), SlotState::kStarting);
    if (Status s = health_.start(); !s) {
      spdlog::error("{}", s.error().message);
      return shut_down(1);
    }
    const bool ready = health_.wait_ready(
        Deadline::after(options_.startup_timeout), [] { return g_stop != 0; },
        [&] { heartbeat(control_.coordinator_slot()); });
    if (!ready) return shut_down(1);
    set_state(control_.coordinator_slot(), SlotState::kReady);
    set_instance_state(InstanceState::kReady);
    spdlog::info("instance '{}' is ready: {} ranks, role {}, epoch {}", control_.instance(),
                 config_.tp_size, role_name(static_cast<Role>(config_.role)), control_.epoch());

    std::optional<Deadline> drain_until;
    for (;;) {
      const uint64_t now = mono_now_ns();
      heartbeat(control_.coordinator_slot());
      if (!broken_)
        broken_ =
            guard_.check(now, state_, CoordinatorRings{submit_, completions_, tasks_, reports_});
      if (broken_) break;
      // Backpressure: while a reader lags, leave submissions in their ring.
      bool busy = !congested() && read_submissions(now);
      // A fresh clock: reports may complete requests submitted in this very
      // iteration, and a completion must not carry its submission's time.
      busy = drain_reports(mono_now_ns()) || busy;
      watch_sessions(now);
      const uint64_t next_deadline = table_->tick(now);
      health_.supervise(now);
      flush_writers();
      acknowledge_sessions();
      mirror_counters();
      if (g_stop != 0 && !drain_until) {
        spdlog::info("draining: {} requests in flight, up to {} ms", table_->live(),
                     options_.drain_timeout.count());
        drain_until = Deadline::after(options_.drain_timeout);
        table_->start_draining();
        set_instance_state(InstanceState::kDraining);
      }
      if (drain_until && (table_->live() == 0 || drain_until->passed())) break;
      if (busy) continue;
      uint64_t wake = std::min<uint64_t>(next_deadline, now + ns_of(50ms));
      wake = std::min(wake, health_.next_due_ns());
      if (sessions_.tracked() != 0) wake = std::min<uint64_t>(wake, now + ns_of(10ms));
      wait_until(
          status_.coordinator_doorbell, [&] { return has_input() || g_stop != 0; },
          Deadline::at_ns(std::max(wake, now)));
    }
    // A drain can end in the very iteration in which the segment was broken
    // (after this iteration's check): look once more, so that a broken
    // instance never exits as if it had stopped cleanly.
    if (!broken_)
      broken_ = guard_.check(mono_now_ns(), state_,
                             CoordinatorRings{submit_, completions_, tasks_, reports_});
    if (broken_) {
      spdlog::critical(
          "instance '{}' is broken: {}; failing every live request and shutting "
          "down",
          control_.instance(), *broken_);
      set_instance_state(InstanceState::kDraining);
      table_->fail_all(fmt::format("the instance shut down: {}", *broken_), mono_now_ns());
      return shut_down(kExitBroken);
    }
    if (table_->live() != 0) {
      spdlog::warn("drain deadline passed with {} requests in flight; failing them",
                   table_->live());
      table_->fail_all("the instance shut down before the request finished", mono_now_ns());
    }
    return shut_down(0);
  }

 private:
  bool congested() const {
    if (completions_.congested()) return true;
    return std::any_of(tasks_.begin(), tasks_.end(),
                       [](const RingWriter& w) { return w.congested(); });
  }

  bool has_input() {
    if (!congested() && submit_.readable()) return true;
    for (auto& r : reports_)
      if (r.readable()) return true;
    return false;
  }

  bool read_submissions(uint64_t now) {
    const uint64_t hellos = submission_stats_.hellos;
    const size_t n = submit_.read(
        [&](const MpscRecord& rec) {
          // A fresh clock per record: the dispatch hops are timed from it.
          dispatch_submission(rec, *table_, sessions_, submission_stats_,
                              std::max(now, mono_now_ns()));
        },
        256);
    if (submission_stats_.hellos != hellos) hello_gate_.retarget();  // wait for what follows too
    return n > 0;
  }

  bool drain_reports(uint64_t now) {
    bool any = false;
    WorkerReport report{};
    for (uint32_t r = 0; r < reports_.size(); ++r) {
      for (int i = 0; i < 256 && reports_[r].try_pop(report); ++i) {
        report.rank = r;  // trust the ring, not the record, for the rank
        // A fresh clock: the report may have been written after this drain
        // began, and the table times it from its stamp.
        table_->on_report(report, std::max(now, mono_now_ns()));
        any = true;
      }
    }
    return any;
  }

  // Engine sessions that ended: a dead one's requests are withdrawn, and
  // every worker forgets the signals it pushed.
  void watch_sessions(uint64_t now) {
    for (const EngineSessions::Ended& e : sessions_.poll(now)) {
      CounterWriter(counters_).add(kSessionsEnded);
      if (!e.died) continue;
      CounterWriter(counters_).add(kSessionsDied);
      spdlog::warn("engine session {:08x} ended without detaching (its process died)", e.session);
      table_->on_session_ended(e.session, now);
      capnp::MallocMessageBuilder msg(64);
      auto w = msg.initRoot<schema::WorkerTask>();
      w.setSessionEnded(e.session);
      for (RingWriter& t : tasks_)
        t.write(MessageType::WORKER_TASK, msg);
      hello_gate_.retarget();
    }
  }

  // A hello is acknowledged once everything written for dead sessions (and
  // before) has been read by every live worker (see engine_sessions.h).
  void acknowledge_sessions() {
    if (!sessions_.hello_pending()) return;
    if (!hello_gate_.open(tasks_, [this](uint32_t r) { return health_.up(r); })) return;
    if (sessions_.acknowledge_pending()) notify_waiters(status_.state_changed);
  }

  void flush_writers() {
    completions_.flush();
    for (RingWriter& w : tasks_)
      w.flush();
  }

  void set_instance_state(InstanceState s) {
    state_ = s;
    control_.set_state(s);
    // systemd's Type=notify: `systemctl start` returns once the instance
    // serves; `systemctl stop` shows it draining.
    if (s == InstanceState::kReady)
      (void)notify_service_manager(fmt::format("READY=1\nSTATUS=instance '{}' serving, {} ranks",
                                               control_.instance(), control_.config().tp_size));
    if (s == InstanceState::kDraining)
      (void)notify_service_manager(
          fmt::format("STOPPING=1\nSTATUS=instance '{}' draining", control_.instance()));
  }

  void mirror_counters() {
    const TableCounters& t = table_->counters();
    CounterWriter mirror(counters_);
    auto set = [&](uint32_t id, uint64_t v) { mirror.set(id, v); };
    set(kSubmitted, t.submitted);
    set(kFinished, t.finished);
    set(kErrors, t.errors);
    set(kCancelled, t.cancelled);
    set(kTimeouts, t.timeouts);
    set(kRejected, t.rejected);
    set(kAbsorbed, t.absorbed);
    set(kStrayReports, t.stray_reports);
    set(kMalformedRecords, submission_stats_.malformed);
    set(kSessionWithdrawals, t.session_withdrawals);
    set(kCompletionsDelayed, completions_.delayed());
    uint64_t delayed = 0;
    for (const RingWriter& w : tasks_)
      delayed += w.delayed();
    set(kTasksDelayed, delayed);
    set(kLiveRequests, table_->live());
    set(kRememberedIds, table_->remembered());
  }

  // What the coordinator knows of a peer instance on this host, for
  // validating ipc destinations; nullopt when it cannot be attached.
  std::optional<PeerInfo> peer_info(std::string_view peer) {
    Result<const ControlSegment*> c = peers_.get(peer);
    if (!c) return std::nullopt;
    const InstanceConfig& pc = (*c)->config();
    return PeerInfo{pc.num_blocks, pc.tp_size, static_cast<Role>(pc.role)};
  }

  int shut_down(int code) {
    spdlog::info("shutting down instance '{}'", control_.instance());
    flush_writers();
    capnp::MallocMessageBuilder msg(64);
    msg.initRoot<schema::WorkerTask>().setShutdown();
    for (RingWriter& w : tasks_)
      w.write(MessageType::WORKER_TASK, msg);
    set_instance_state(InstanceState::kDead);
    health_.stop_all(Deadline::after(5s));
    const size_t pools = unlink_kvrelay_pools(control_);
    set_state(control_.coordinator_slot(), SlotState::kExiting);
    if (Status s = control_.unlink(); !s) spdlog::warn("unlink: {}", s.error().message);
    spdlog::info("instance '{}' stopped; removed its control segment and {} pool segments",
                 control_.instance(), pools);
    return code;
  }

  const CoordinatorOptions& options_;
  ControlSegment control_;
  InstanceConfig config_;
  InstanceStatus& status_;
  CountersBlock& counters_;
  MpscRing submit_;
  RingWriter completions_;
  CompletionPublisher publisher_;
  std::vector<RingWriter> tasks_;
  std::vector<SpscRing<WorkerReport>> reports_;
  std::unique_ptr<TaskTable> table_;
  EngineSessions sessions_;
  RankHealth health_;
  SharedStateGuard guard_;
  PeerInstances peers_;
  SubmissionStats submission_stats_;
  InstanceState state_ = InstanceState::kInitialising;
  std::optional<std::string> broken_;
  HelloGate hello_gate_;
};

// Before any thread or worker starts: threads inherit the slice (the
// workers put the kernel's default back, worker.cpp). Zero also puts the
// default back, whatever slice the process that started us had.
void take_wake_slice(Nanos slice) {
  Result<Nanos> got = set_scheduler_slice(slice);
  if (slice.count() == 0 && got) return;
  if (!got) {
    spdlog::info("scheduler slice left as it is: {}", got.error().message);
  } else if (got->count() == 0) {
    spdlog::info(
        "this kernel keeps no scheduler slice per task (Linux 6.12+ does): "
        "--wake-slice-us has no effect");
  } else {
    spdlog::info(
        "scheduler slice {} us: a report or a request that wakes the coordinator "
        "preempts a running copy",
        std::chrono::duration_cast<std::chrono::microseconds>(*got).count());
  }
}

}  // namespace

int run_coordinator(const CoordinatorOptions& o) {
  if (Status s = setup_logging("coordinator", o.log_dir, o.log_level, instance_of(o.config)); !s) {
    fmt::print(stderr, "kvrelay-coordinator: {}\n", s.error().message);
    return 2;
  }
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  if (Status s = place_process(o.idle, o.cpus, 0); !s) {
    spdlog::error("{}", s.error().message);
    return 2;
  }
  if (o.idle != IdleStrategy::kPark || !o.cpus.empty())
    spdlog::info("idle strategy {}{}", idle_strategy_name(o.idle),
                 o.cpus.empty() ? "" : fmt::format(", pinned to CPU {}", o.cpus[0]));
  take_wake_slice(o.wake_slice);

  Result<ControlSegment> control =
      ControlSegment::create(o.config, SegmentOptions{.group_access = o.group_access});
  if (!control) {
    spdlog::error("cannot create instance '{}': {}", instance_of(o.config),
                  control.error().message);
    return control.code() == Errc::kAlreadyExists ? 3 : 1;
  }
  if (control->replaced())
    spdlog::warn("replaced the stale segment of instance '{}': {} (epoch {} -> {})",
                 control->instance(), control->replaced()->reason, control->replaced()->old_epoch,
                 control->epoch());
  try {
    Coordinator coordinator(o, std::move(control).value());
    return coordinator.run();
  } catch (const std::exception& e) {
    spdlog::error("cannot run instance '{}': {}", instance_of(o.config), e.what());
    return 1;
  }
}

}  // namespace kvrelay::coordinator

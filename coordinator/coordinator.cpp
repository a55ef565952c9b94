#include "coordinator/coordinator.h"

#include <fmt/format.h>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <optional>
#include <unordered_map>

#include "coordinator/coordinator_counters.h"
#include "coordinator/ring_writer.h"
#include "coordinator/supervisor.h"
#include "coordinator/task_table.h"
#include "schemas/codec.h"
#include "schemas/records.h"
#include "shm/barrier.h"
#include "shm/control_segment.h"
#include "shm/counters.h"
#include "shm/liveness.h"
#include "shm/pool_segment.h"
#include "shm/process_logging.h"

namespace kvrelay::coordinator {

namespace {

using namespace std::chrono_literals;
using records::WorkerReport;
using schema::MessageType;

// Set by SIGTERM/SIGINT; the handler also rings the doorbell so the loop
// wakes at once.
volatile sig_atomic_t g_stop = 0;
WaitEvent* g_doorbell = nullptr;

void on_stop_signal(int) {
  g_stop = 1;
  if (g_doorbell != nullptr) {
    g_doorbell->sequence.fetch_add(1, std::memory_order_release);
    futex_wake_all(g_doorbell->sequence);  // a system call: async-signal-safe
  }
}

class Coordinator : public Sink {
 public:
  Coordinator(const CoordinatorOptions& o, ControlSegment control)
      : options_(o),
        control_(std::move(control)),
        config_(control_.config()),
        status_(control_.status()),
        counters_(control_.counters(kCoordinatorCounters)),
        submit_(control_.submit_ring().value()),
        completions_(control_.completion_ring().value(), nullptr) {
    submit_.set_stall_timeout(std::chrono::milliseconds(config_.stall_timeout_ms));
    tasks_.reserve(config_.tp_size);
    for (uint32_t r = 0; r < config_.tp_size; ++r) {
      tasks_.emplace_back(control_.task_ring(r).value(), &status_.worker_doorbell[r]);
      reports_.push_back(control_.report_ring<WorkerReport>(r).value());
    }
    TableOptions table_options;
    table_options.default_deadline_ns = uint64_t{config_.request_deadline_ms} * 1'000'000ULL;
    table_options.tombstone_ns =
        std::max<uint64_t>(2 * table_options.default_deadline_ns, 60'000'000'000ULL);
    table_options.peer_blocks = [this](const std::string& peer) { return peer_blocks(peer); };
    table_options.withdraw_timeout_ns = uint64_t{config_.peer_timeout_ms} * 1'000'000ULL;
    table_ = std::make_unique<TaskTable>(messages::Limits::from(config_), std::move(table_options),
                                         *this);
    std::vector<std::string_view> labels(std::begin(kCoordinatorCounterLabels),
                                         std::end(kCoordinatorCounterLabels));
    define_counters(counters_, labels, {{"request_latency", "ns"}});
    seen_registrations_.assign(config_.tp_size, 0);
    lost_.assign(config_.tp_size, false);
  }

  // ---- Sink ----
  void to_worker(uint32_t rank, capnp::MessageBuilder& task) override {
    tasks_[rank].write(MessageType::WORKER_TASK, task);
  }
  void complete(capnp::MessageBuilder& completion) override {
    // Stamped when published: the loop's clock may be older than the
    // reports that completed the request.
    auto stamp = completion.getRoot<schema::Completion>();
    stamp.setCompletedNs(std::max(stamp.getCompletedNs(), mono_now_ns()));
    auto c = stamp.asReader();
    if (c.getStatus() == schema::Completion::Status::FINISHED && c.getSubmittedNs() != 0)
      CounterWriter(counters_).record(kRequestLatencyNs, c.getCompletedNs() - c.getSubmittedNs());
    completions_.write(MessageType::COMPLETION, completion);
  }

  void rank_unresponsive(uint32_t rank, const std::string& why) override {
    if (supervisor_ && supervisor_->pid_of(rank) != 0) {
      spdlog::error("rank {} {}; killing its worker (pid {}) so that it stops writing", rank, why,
                    supervisor_->pid_of(rank));
      kill(static_cast<pid_t>(supervisor_->pid_of(rank)), SIGKILL);
    } else {
      spdlog::error("rank {} {} (an external worker: not killed)", rank, why);
    }
  }

  uint32_t begin_load_progress(uint64_t handle, const std::string& id, uint32_t first_layer,
                               uint32_t layer_count) override {
    SwapProgressTable& t = control_.swap_progress();
    // A free slot, else the longest-finished one.
    SwapProgressSlot* pick = nullptr;
    for (SwapProgressSlot& slot : t.slots) {
      const auto state = static_cast<SwapProgressState>(slot.state.load(std::memory_order_acquire));
      if (state == SwapProgressState::kFree) {
        pick = &slot;
        break;
      }
      if (state != SwapProgressState::kLoading && (pick == nullptr || slot.handle < pick->handle))
        pick = &slot;
    }
    if (pick == nullptr) {
      spdlog::warn("no swap progress slot free for '{}': its per-layer waits will not be served",
                   id);
      return kNoProgressSlot;
    }
    pick->state.store(static_cast<uint32_t>(SwapProgressState::kFree), std::memory_order_release);
    pick->tag.store(records::request_tag(id), std::memory_order_relaxed);
    pick->handle = handle;
    pick->first_layer = first_layer;
    pick->layer_count = layer_count;
    for (auto& done : pick->layers_done)
      done.store(0, std::memory_order_relaxed);
    pick->state.store(static_cast<uint32_t>(SwapProgressState::kLoading),
                      std::memory_order_release);
    notify_waiters(t.slot_taken);
    return static_cast<uint32_t>(pick - t.slots);
  }

  void end_load_progress(uint32_t slot, bool finished) override {
    if (slot >= kSwapProgressSlots) return;
    SwapProgressSlot& s = control_.swap_progress().slots[slot];
    s.state.store(
        static_cast<uint32_t>(finished ? SwapProgressState::kDone : SwapProgressState::kFailed),
        std::memory_order_release);
    notify_waiters(s.changed);
  }

  int run() {
    register_self(control_.coordinator_slot(), SlotState::kStarting);
    g_doorbell = &status_.coordinator_doorbell;
    if (!options_.external_workers) {
      supervisor_ = std::make_unique<Supervisor>(
          options_.worker_binary.empty() ? default_worker_binary() : options_.worker_binary,
          control_.instance(), config_.tp_size, options_.log_dir, options_.log_level);
      if (Status s = supervisor_->start_all(); !s) {
        spdlog::error("{}", s.error().message);
        return shut_down(1);
      }
    } else {
      spdlog::info("waiting for {} external kvrelay-worker processes (--instance {})",
                   config_.tp_size, control_.instance());
    }
    if (!wait_for_workers()) return shut_down(1);
    set_state(control_.coordinator_slot(), SlotState::kReady);
    control_.set_state(InstanceState::kReady);
    spdlog::info("instance '{}' is ready: {} ranks, role {}, epoch {}", control_.instance(),
                 config_.tp_size, role_name(static_cast<Role>(config_.role)), control_.epoch());

    std::optional<Deadline> drain_until;
    for (;;) {
      const uint64_t now = mono_now_ns();
      heartbeat(control_.coordinator_slot());
      bool busy = drain_submissions(now);
      // A fresh clock: reports may complete requests submitted in this very
      // iteration, and a completion must not carry its submission's time.
      busy = drain_reports(mono_now_ns()) || busy;
      const uint64_t next_deadline = table_->tick(now);
      supervise(now);
      flush_writers();
      mirror_counters();
      if (g_stop != 0 && !drain_until) {
        spdlog::info("draining: {} requests in flight, up to {} ms", table_->live(),
                     options_.drain_timeout.count());
        drain_until = Deadline::after(options_.drain_timeout);
        table_->start_draining();
        control_.set_state(InstanceState::kDraining);
      }
      if (drain_until && (table_->live() == 0 || drain_until->passed())) break;
      if (busy) continue;
      uint64_t wake = std::min<uint64_t>(next_deadline, now + 50'000'000ULL);
      if (supervisor_) wake = std::min(wake, supervisor_->next_restart_ns());
      wait_until(
          status_.coordinator_doorbell, [&] { return has_input() || g_stop != 0; },
          Deadline::at_ns(std::max(wake, now)));
    }
    if (table_->live() != 0) {
      spdlog::warn("drain deadline passed with {} requests in flight; failing them",
                   table_->live());
      table_->fail_all("the instance shut down before the request finished", mono_now_ns());
    }
    return shut_down(0);
  }

 private:
  // Waits until every rank's worker is registered and ready.
  bool wait_for_workers() {
    const Deadline until = Deadline::after(options_.startup_timeout);
    for (;;) {
      heartbeat(control_.coordinator_slot());
      uint32_t ready = 0;
      for (uint32_t r = 0; r < config_.tp_size; ++r)
        ready += read_slot(control_.worker_slot(r)).state == SlotState::kReady ? 1 : 0;
      if (ready == config_.tp_size) {
        update_ready_flags();
        return true;
      }
      if (g_stop != 0) return false;
      if (until.passed()) {
        for (uint32_t r = 0; r < config_.tp_size; ++r) {
          if (read_slot(control_.worker_slot(r)).state != SlotState::kReady)
            spdlog::error(
                "rank {} did not become ready within {} ms{}", r, options_.startup_timeout.count(),
                options_.log_dir.empty()
                    ? ""
                    : fmt::format(" (see {}/kvrelay-worker-rank{}.log)", options_.log_dir, r));
        }
        return false;
      }
      supervise(mono_now_ns());
      wait_until(
          status_.coordinator_doorbell, [] { return g_stop != 0; }, Deadline::after(20ms));
    }
  }

  bool has_input() {
    if (submit_.readable()) return true;
    for (auto& r : reports_)
      if (r.size() != 0) return true;
    return false;
  }

  bool drain_submissions(uint64_t now) {
    const size_t n = submit_.read(
        [&](int32_t type, std::span<const std::byte> payload) { dispatch(type, payload, now); },
        256);
    return n > 0;
  }

  template <class T, class Fn>
  void decode(std::span<const std::byte> payload, const char* what, uint64_t now, Fn&& fn) {
    Status s = messages::with_message<T>(payload, [&](typename T::Reader r) -> Status {
      fn(r);
      return {};
    });
    if (!s) {
      CounterWriter(counters_).add(kMalformedRecords);
      table_->on_malformed(what, s.error().message, now);
    }
  }

  void dispatch(int32_t type, std::span<const std::byte> payload, uint64_t now) {
    switch (static_cast<MessageType>(type)) {
      case MessageType::CACHE_TASK:
        decode<schema::CacheTask>(payload, "CacheTask", now,
                                  [&](auto r) { table_->on_cache_task(r, now); });
        return;
      case MessageType::CACHE_DEST:
        decode<schema::CacheDest>(payload, "CacheDest", now,
                                  [&](auto r) { table_->on_cache_dest(r, now); });
        return;
      case MessageType::SWAP_TASK:
        decode<schema::SwapTask>(payload, "SwapTask", now,
                                 [&](auto r) { table_->on_swap(r, now); });
        return;
      case MessageType::CONNECT_TASK:
        decode<schema::ConnectTask>(payload, "ConnectTask", now,
                                    [&](auto r) { table_->on_connect(r, now); });
        return;
      case MessageType::CANCEL:
        decode<schema::Cancel>(payload, "Cancel", now, [&](auto r) { table_->on_cancel(r, now); });
        return;
      case MessageType::REGISTER_POOL:
        decode<schema::RegisterPool>(payload, "RegisterPool", now,
                                     [&](auto r) { table_->on_register_pool(r, now); });
        return;
      default:
        CounterWriter(counters_).add(kMalformedRecords);
        table_->on_malformed(fmt::format("record of type {}", type),
                             "not a message an engine may submit", now);
    }
  }

  bool drain_reports(uint64_t now) {
    bool any = false;
    WorkerReport report{};
    for (uint32_t r = 0; r < reports_.size(); ++r) {
      for (int i = 0; i < 256 && reports_[r].try_pop(report); ++i) {
        report.rank = r;  // trust the ring, not the record, for the rank
        table_->on_report(report, now);
        any = true;
      }
    }
    return any;
  }

  void supervise(uint64_t now) {
    if (supervisor_) {
      // At most every millisecond: the pidfd poll is a system call, which
      // costs ~10 us on the VMs we measure on, and a busy loop turns often.
      if (now >= next_exit_poll_) {
        next_exit_poll_ = now + 1'000'000ULL;
        for (const WorkerExit& e : supervisor_->poll_exits(Deadline::now()))
          worker_lost(e.rank, e.reason, now);
      }
      for (uint32_t rank : supervisor_->restart_due(now)) {
        CounterWriter(counters_).add(kWorkerRestarts);
        lost_[rank] = false;
        table_->set_rank_up(rank);
      }
    } else if (now >= next_external_check_) {
      next_external_check_ = now + 100'000'000ULL;
      for (uint32_t r = 0; r < config_.tp_size; ++r) {
        const SlotSnapshot s = read_slot(control_.worker_slot(r));
        if (s.registrations != seen_registrations_[r]) {
          seen_registrations_[r] = s.registrations;
          lost_[r] = false;
          table_->set_rank_up(r);
        }
        if (!lost_[r] && s.state != SlotState::kEmpty &&
            judge_peer(s, std::chrono::milliseconds(config_.peer_timeout_ms)) == PeerHealth::kDead)
          worker_lost(r, fmt::format("pid {} is gone", s.owner.pid), now);
      }
    }
    update_ready_flags();
  }

  void worker_lost(uint32_t rank, const std::string& reason, uint64_t now) {
    if (lost_[rank]) return;
    lost_[rank] = true;
    CounterWriter(counters_).add(kWorkersLost);
    spdlog::error("rank {} lost: {}", rank, reason);
    set_state(control_.worker_slot(rank), SlotState::kEmpty);
    drain_reports(now);  // what it reported before dying still counts
    table_->on_rank_lost(rank, reason, now);
    // Nothing addressed to the dead worker is still wanted: its requests
    // have failed. The restarted worker starts from empty rings.
    size_t dropped = tasks_[rank].discard_backlog();
    dropped += control_.task_ring(rank)->read([](int32_t, std::span<const std::byte>) {});
    auto signals = control_.signal_ring<records::LayerSignal>(rank);
    records::LayerSignal s{};
    while (signals && signals->try_pop(s))
      ++dropped;
    if (dropped != 0)
      spdlog::info("rank {}: discarded {} records queued for the dead worker", rank, dropped);
    // Anyone lined up with it must not wait for it.
    Barrier(control_.barrier()).poison(static_cast<uint16_t>(config_.tp_size));
  }

  void update_ready_flags() {
    bool changed = false;
    for (uint32_t r = 0; r < config_.tp_size; ++r) {
      const int32_t ready =
          !lost_[r] && read_slot(control_.worker_slot(r)).state == SlotState::kReady ? 1 : 0;
      if (status_.ready_flags[r].exchange(ready, std::memory_order_acq_rel) != ready)
        changed = true;
    }
    if (changed) notify_waiters(status_.state_changed);
  }

  void flush_writers() {
    completions_.flush();
    for (RingWriter& w : tasks_)
      w.flush();
  }

  void mirror_counters() {
    const TableCounters& t = table_->counters();
    auto set = [&](uint32_t id, uint64_t v) {
      counters_.values[id].store(v, std::memory_order_relaxed);
    };
    set(kSubmitted, t.submitted);
    set(kFinished, t.finished);
    set(kErrors, t.errors);
    set(kCancelled, t.cancelled);
    set(kTimeouts, t.timeouts);
    set(kRejected, t.rejected);
    set(kAbsorbed, t.absorbed);
    set(kStrayReports, t.stray_reports);
    set(kCompletionsDelayed, completions_.delayed());
    uint64_t delayed = 0;
    for (const RingWriter& w : tasks_)
      delayed += w.delayed();
    set(kTasksDelayed, delayed);
  }

  // The block count of a peer (decode) instance on this host, for validating
  // ipc destinations; nullopt when it cannot be attached.
  std::optional<uint32_t> peer_blocks(const std::string& peer) {
    auto it = peers_.find(peer);
    if (it != peers_.end()) {
      const SlotSnapshot s = read_slot(it->second.control->coordinator_slot());
      if (it->second.judge->judge(s, std::chrono::milliseconds(config_.peer_timeout_ms)) ==
          PeerHealth::kHealthy)
        return it->second.control->config().num_blocks;
      peers_.erase(it);
    }
    Result<ControlSegment> c =
        ControlSegment::attach(peer, AttachOptions{.access = SegmentAccess::kReadOnly});
    if (!c) return std::nullopt;
    const uint32_t blocks = c->config().num_blocks;
    peers_[peer] = Peer{std::make_unique<ControlSegment>(std::move(c).value()),
                        std::make_unique<CachedPeerJudge>()};
    return blocks;
  }

  int shut_down(int code) {
    spdlog::info("shutting down instance '{}'", control_.instance());
    flush_writers();
    capnp::MallocMessageBuilder msg(64);
    msg.initRoot<schema::WorkerTask>().setShutdown();
    for (RingWriter& w : tasks_)
      w.write(MessageType::WORKER_TASK, msg);
    control_.set_state(InstanceState::kDead);
    if (supervisor_) supervisor_->stop_all(Deadline::after(5s));
    const size_t pools = unlink_kvrelay_pools(control_);
    set_state(control_.coordinator_slot(), SlotState::kExiting);
    if (Status s = control_.unlink(); !s) spdlog::warn("unlink: {}", s.error().message);
    spdlog::info("instance '{}' stopped; removed its control segment and {} pool segments",
                 control_.instance(), pools);
    g_doorbell = nullptr;
    return code;
  }

  const CoordinatorOptions& options_;
  ControlSegment control_;
  InstanceConfig config_;
  InstanceStatus& status_;
  CountersBlock& counters_;
  MpscRing submit_;
  RingWriter completions_;
  std::vector<RingWriter> tasks_;
  std::vector<SpscRing<WorkerReport>> reports_;
  std::unique_ptr<TaskTable> table_;
  std::unique_ptr<Supervisor> supervisor_;
  // Peer instances named by CacheDests, judged per request (/proc at most
  // every 10 ms).
  struct Peer {
    std::unique_ptr<ControlSegment> control;
    std::unique_ptr<CachedPeerJudge> judge;
  };
  std::unordered_map<std::string, Peer> peers_;
  std::vector<uint32_t> seen_registrations_;
  std::vector<bool> lost_;
  uint64_t next_exit_poll_ = 0;
  uint64_t next_external_check_ = 0;
};

}  // namespace

int run_coordinator(const CoordinatorOptions& o) {
  if (Status s = setup_logging("coordinator", o.log_dir, o.log_level); !s) {
    fmt::print(stderr, "kvrelay-coordinator: {}\n", s.error().message);
    return 2;
  }
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

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
  Coordinator coordinator(o, std::move(control).value());
  return coordinator.run();
}

}  // namespace kvrelay::coordinator

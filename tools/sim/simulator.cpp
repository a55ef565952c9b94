#include "simulator.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>

#include "block_allocator.h"
#include "coordinator/coordinator_counters.h"
#include "idle_queue.h"
#include "instance/control_layout.h"
#include "instance/control_segment.h"
#include "instance/pool_segment.h"
#include "kv_pattern.h"
#include "quantiles.h"
#include "shm/counters.h"
#include "shm/liveness.h"
#include "worker/worker_counters.h"

namespace kvrelay::sim {

namespace {

using namespace std::chrono_literals;

struct SimRequest {
  std::string id;
  RequestBlocks blocks;
  uint64_t tokens = 0;
  uint64_t prefilled = 0;
  uint32_t slot = 0;
  uint64_t legacy_step = 0;
  uint64_t nonce = 0;  // shared by its ExpectSpec and its CacheDestSpec
  bool late_dest = false;
  bool dest_sent = false;
  uint64_t dest_due_step = 0;
  bool prefill_done = false;
  uint64_t last_signal_ns = 0;  // its last layer computed (its signal is pushed next)
  uint32_t completions = 0;
  uint32_t arrivals = 0;  // the decode engine's `arrived` completions (expect_arrivals)
  bool verify = false;    // finished: its destination bytes are checked on release
  bool released = false;  // its blocks handed back
};

// What the checks on the idle queue found (they run on its thread), merged
// into the report when the run ends.
class CheckTally {
 public:
  void add_stray(std::string what) {
    std::lock_guard lock(m_);
    ++stray_blocks_;
    if (first_error_.empty()) first_error_ = std::move(what);
  }
  void add_wrong(uint64_t words, std::string what) {
    std::lock_guard lock(m_);
    wrong_words_ += words;
    if (first_error_.empty()) first_error_ = std::move(what);
  }
  void merge_into(SimReport& report) const {
    std::lock_guard lock(m_);
    report.stray_blocks += stray_blocks_;
    report.wrong_words += wrong_words_;
    if (report.first_error.empty()) report.first_error = first_error_;
  }

 private:
  mutable std::mutex m_;
  uint64_t stray_blocks_ = 0;
  uint64_t wrong_words_ = 0;
  std::string first_error_;
};

// Merged histogram over the prefill instance's worker blocks.
Quantiles worker_quantiles(const ControlSegment& control, uint32_t histogram) {
  HistogramSnapshot merged;
  for (uint32_t r = 0; r < control.config().tp_size; ++r) {
    const CountersSnapshot s = snapshot_counters(control.counters(worker_counters_index(r)));
    if (histogram < s.histograms.size()) merged.merge(s.histograms[histogram]);
  }
  return quantiles_of(merged);
}

Quantiles coordinator_quantiles(const ControlSegment& control, uint32_t histogram) {
  const CountersSnapshot s = snapshot_counters(control.counters(kCoordinatorCounters));
  return histogram < s.histograms.size() ? quantiles_of(s.histograms[histogram]) : Quantiles{};
}

class Simulation {
 public:
  Simulation(const SimOptions& o, Client& prefill, Client& decode, std::string decode_instance)
      : decode_instance_(std::move(decode_instance)),
        o_(o),
        prefill_(prefill),
        decode_(decode),
        rng_(o.seed) {
    const InstanceInfo& info = prefill.info();
    tp_ = info.tp_size;
    // Heterogeneous TP: the decode instance may have other ranks, each with
    // other heads; blocks carry the pattern of the model head, not the rank.
    decode_tp_ = decode.info().tp_size;
    layers_ = info.device_pool.total_layers();
    block_tokens_ = info.device_pool.block_size;
    for (uint32_t r = 0; r < std::max(tp_, decode_tp_) && fatal_.empty(); ++r) {
      for (auto [client, side, count, views] : {std::tuple{&prefill, "prefill", tp_, &src_},
                                                std::tuple{&decode, "decode", decode_tp_, &dst_}}) {
        if (r >= count) continue;
        auto pool = client->open_pool(r, PoolTier::kDevice);
        if (!pool) {
          fatal_ = fmt::format("cannot map {} rank {}'s pool: {}", side, r, pool.error().message);
          break;
        }
        views->push_back(std::make_unique<PoolView>(std::move(pool).value()));
      }
    }
    if (!fatal_.empty()) return;
    // The extra (speculative) layers may hold fewer blocks: allocate within both.
    src_alloc_ = std::make_unique<BlockAllocator>(usable_blocks(*src_[0]), o.seed * 3 + 1);
    dst_alloc_ = std::make_unique<BlockAllocator>(usable_blocks(*dst_[0]), o.seed * 5 + 2);
  }

  SimReport run(const std::string& prefill_instance) {
    if (!fatal_.empty()) {
      report_.requests = o_.requests;
      report_.first_error = fatal_;
      report_.aborted = true;
      return report_;
    }
    poison_pools();
    connect();
    const auto start = std::chrono::steady_clock::now();
    const Deadline give_up = Deadline::after(o_.timeout);
    uint64_t step = 0;
    uint64_t next_kill =
        o_.kill_every_ms != 0 ? mono_now_ns() + o_.kill_every_ms * 1'000'000ULL : UINT64_MAX;
    while ((finished_count_ < o_.requests || arrived_count_ < expected_arrivals()) &&
           !give_up.passed() && fatal_.empty()) {
      ++step;
      if (mono_now_ns() >= next_kill) {
        kill_random_worker(prefill_instance);
        next_kill = mono_now_ns() + o_.kill_every_ms * 1'000'000ULL;
      }
      admit(step);
      send_due_dests(step);
      if (o_.legacy) {
        run_legacy_step(step);
      } else {
        run_chunk_step(step);
      }
      drain_completions(Deadline::now());
      // The decode instance is only ever a peer: notice its end here.
      if (Status d = decode_.coordinator_alive(); !d) stop(d.error().message);
      if (active_.empty() && !more_to_admit()) {
        // Only waiting for completions (and late decode halves).
        send_due_dests(UINT64_MAX);
        drain_completions(Deadline::after(20ms));
      }
      draw_progress();
    }
    report_.aborted = !fatal_.empty();
    if (report_.aborted) report_.first_error = fatal_;
    report_.timed_out =
        !report_.aborted && (finished_count_ < o_.requests || arrived_count_ < expected_arrivals());
    report_.soak = o_.kill_every_ms != 0;
    if (report_.soak) report_.ranks_not_back = ranks_not_back(prefill_instance);
    report_.min_finished = o_.min_finished;
    report_.expect_arrivals = o_.expect_arrivals;
    drain_completions(Deadline::after(200ms));  // an extra completion would show up here
    checks_.resume();
    checks_.wait_all();
    collect_released();
    tally_.merge_into(report_);
    report_.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    report_.requests = o_.requests;
    for (const auto& [id, r] : requests_) {
      if (r->completions != 1) ++report_.missing_or_extra;
      if (o_.expect_arrivals && r->arrivals != 1) ++report_.missing_or_extra;
    }
    report_.exposed = exact_quantiles(exposed_);
    report_.exposed_arrival = exact_quantiles(exposed_arrival_);
    if (Result<ControlSegment> c = ControlSegment::attach(
            prefill_instance,
            AttachOptions{.access = SegmentAccess::kReadOnly, .allow_stale = true});
        c) {
      report_.signal_to_copy = worker_quantiles(*c, worker::kSignalToCopyDoneNs);
      report_.layer_copy = worker_quantiles(*c, worker::kLayerCopyNs);
      report_.signal_wake = worker_quantiles(*c, worker::kSignalWrittenToReadNs);
      report_.report_hop = coordinator_quantiles(*c, coordinator::kReportWrittenToReadNs);
      report_.publish_hop = coordinator_quantiles(*c, coordinator::kReportReadToCompletionNs);
      report_.tail_to_report = worker_quantiles(*c, worker::kLastSignalToReportNs);
      report_.tail_report_hop = coordinator_quantiles(*c, coordinator::kLastReportWrittenToReadNs);
    }
    if (Result<ControlSegment> c = ControlSegment::attach(
            decode_instance_,
            AttachOptions{.access = SegmentAccess::kReadOnly, .allow_stale = true});
        c && o_.expect_arrivals) {
      report_.landed_wake = worker_quantiles(*c, worker::kLandedToReadNs);
      report_.arrival_tail_to_report = worker_quantiles(*c, worker::kLastLandedToReportNs);
      report_.arrival_tail_report_hop =
          coordinator_quantiles(*c, coordinator::kLastReportWrittenToReadNs);
      report_.arrival_publish_hop =
          coordinator_quantiles(*c, coordinator::kReportReadToCompletionNs);
    }
    if (o_.progress) fmt::print(stderr, "\n");
    return report_;
  }

 private:
  static uint32_t usable_blocks(const PoolView& p) {
    const PoolGeometry& g = p.geometry();
    return g.extra_layers > 0 ? std::min(g.num_blocks, g.extra_layer_blocks) : g.num_blocks;
  }

  // Every pool of both sides.
  std::vector<const PoolView*> all_pools() const {
    std::vector<const PoolView*> all;
    for (const auto* side : {&src_, &dst_})
      for (const auto& p : *side) all.push_back(p.get());
    return all;
  }

  void poison_pools() {
    {
      for (const PoolView* pool : all_pools()) {
        const PoolGeometry& g = pool->geometry();
        for (uint32_t l = 0; l < g.total_layers(); ++l)
          for (uint32_t t : tensor_ids(g))
            for (uint32_t b = 0; b < g.blocks_in_layer(l); ++b)
              poison_block(*pool, l, t, b);
      }
    }
  }

  // Soak mode: SIGKILL one worker, of the prefill or the decode instance.
  void kill_random_worker(const std::string& prefill_instance) {
    const std::string& instance = rng_() % 4 == 0 ? decode_instance_ : prefill_instance;
    auto c = ControlSegment::attach(instance, AttachOptions{.access = SegmentAccess::kReadOnly});
    if (!c) return;
    const auto rank = static_cast<uint32_t>(rng_() % c->config().tp_size);
    const SlotSnapshot s = read_slot(c->worker_slot(rank));
    if (s.owner.pid == 0 || s.state != SlotState::kReady) return;  // still restarting
    if (::kill(static_cast<pid_t>(s.owner.pid), SIGKILL) == 0) {
      ++report_.kills;
      trace(fmt::format("killed worker pid {} (rank {} of '{}')", s.owner.pid, rank, instance),
            "-");
    }
  }

  // After a soak: every worker of both instances must be serving again. A
  // killed worker is restarted (its backoff is at most 5 s); one given up
  // would leave its instance failing every request from then on, and the
  // rest of the soak would have tested nothing but that. Waits up to 30 s
  // (a sanitizer build's worker starts slowly).
  std::vector<std::string> ranks_not_back(const std::string& prefill_instance) {
    std::vector<std::string> missing;
    const Deadline until = Deadline::after(30s);
    const std::string* instances[] = {&prefill_instance, &decode_instance_};
    for (const std::string* instance : instances) {
      auto c = ControlSegment::attach(*instance, AttachOptions{.access = SegmentAccess::kReadOnly});
      if (!c) {
        missing.push_back(fmt::format("'{}' ({})", *instance, c.error().message));
        continue;
      }
      for (uint32_t r = 0; r < c->config().tp_size; ++r) {
        while (read_slot(c->worker_slot(r)).state != SlotState::kReady && !until.passed())
          std::this_thread::sleep_for(10ms);
        if (read_slot(c->worker_slot(r)).state != SlotState::kReady)
          missing.push_back(fmt::format("rank {} of '{}'", r, *instance));
      }
    }
    return missing;
  }

  // As an engine does when a decode instance joins: every rank maps the
  // decode instance's pool now, instead of on the first request.
  void connect() {
    ConnectSpec c;
    c.task_id = 1;
    c.protocol = protocol();
    c.peer_instance = decode_instance_;
    if (o_.tcp || o_.rdma) {
      c.peer_address = o_.peer_address;
      c.ports = o_.rdma ? decode_.info().rdma_ports : decode_tcp_ports();
    }
    const Status submitted = prefill_.submit(c, Deadline::after(10s));
    submit(submitted, "connect");
    if (!submitted) return;  // refused: no completion follows
    Result<Completion> done = prefill_.wait(Deadline::after(60s));
    if (!done || done->status != CompletionStatus::kFinished) {
      if (report_.first_error.empty())
        report_.first_error = fmt::format("connect to '{}' failed: {}", decode_instance_,
                                          done ? done->message : done.error().message);
    }
  }

  bool more_to_admit() const { return admitted_ < o_.requests; }

  // Starts new requests while slots and blocks are free.
  void admit(uint64_t step) {
    uint32_t admitted_now = 0;
    while (more_to_admit() && active_.size() < o_.batch) {
      std::uniform_int_distribution<uint32_t> tok(o_.min_tokens, o_.max_tokens);
      const uint64_t tokens = tok(rng_);
      const auto blocks = static_cast<uint32_t>((tokens + block_tokens_ - 1) / block_tokens_);
      uint32_t cached = 0;
      if (std::uniform_real_distribution<double>(0, 1)(rng_) < o_.prefix_hit_rate)
        cached = std::uniform_int_distribution<uint32_t>(1, blocks)(rng_);
      auto taken = take_blocks(blocks, blocks - cached);
      if (!taken) return;  // wait for completions to free blocks
      auto& [src, dst] = *taken;
      auto r = std::make_unique<SimRequest>();
      r->id = fmt::format("sim-{}-{}", o_.seed, admitted_);
      r->blocks = RequestBlocks{admitted_ + 1, std::move(src), std::move(dst)};
      r->tokens = tokens;
      r->slot = free_slot();
      r->legacy_step = step;
      r->late_dest = std::uniform_real_distribution<double>(0, 1)(rng_) < o_.late_dest_rate;
      if (o_.inject_fault == SimOptions::Fault::kStray && admitted_ == 1 && !r->blocks.dst.empty())
        write_wrong_word(*dst_[0], r->blocks.dst[0]);
      check_untouched(*r);
      // The decode engine names the sender and chooses the request's nonce,
      // which travels with the destination blocks (send_dest).
      r->nonce = Client::random_nonce();
      if (o_.expect_arrivals) {
        ExpectSpec e;
        e.request_id = r->id;
        e.dest_block_ids = r->blocks.dst;
        e.from_instance = prefill_.info().instance;
        e.request_nonce = r->nonce;
        submit(decode_.submit(e, Deadline::after(10s)), r->id);
      }
      CacheTaskSpec t;
      t.request_id = r->id;
      t.src_block_ids = r->blocks.src;
      t.need_prefill_tokens = tokens;
      if (o_.legacy) {
        t.legacy_prefill_step = step;
      } else {
        t.engine_slot = r->slot;
      }
      submit(prefill_.submit(t, Deadline::after(10s)), r->id);
      trace("submitted", r->id);
      if (!r->late_dest) send_dest(*r);
      active_.push_back(r.get());
      requests_[r->id] = std::move(r);
      ++admitted_;
      ++admitted_now;
    }
    (void)admitted_now;
  }

  // Blocks for a new request, once freed blocks whose poisoning is still
  // queued are back; nullopt while the rest are held by live requests.
  std::optional<std::pair<std::vector<uint32_t>, std::vector<uint32_t>>> take_blocks(
      uint32_t src_blocks, uint32_t dst_blocks) {
    for (;;) {
      collect_released();
      auto src = src_alloc_->take(src_blocks);
      auto dst = src ? dst_alloc_->take(dst_blocks) : std::nullopt;
      if (src && dst) return std::pair{std::move(*src), std::move(*dst)};
      if (src) src_alloc_->give_back(*src);
      if (releasing_.empty()) return std::nullopt;
      settle();
      for (IdleQueue::Ticket t : releasing_.front().first)
        checks_.wait(t);
    }
  }

  uint32_t free_slot() const {
    for (uint32_t s = 0;; ++s) {
      bool used = false;
      for (const SimRequest* r : active_)
        used = used || r->slot == s;
      if (!used) return s;
    }
  }

  // Destination blocks must be untouched (still poisoned) when handed out.
  // Checked on the idle queue (a request's blocks are tens of MiB); its
  // layer signals wait for the check (await_untouched_checks), so none of
  // its own bytes can land first.
  void check_untouched(const SimRequest& r) {
    for (uint32_t rank = 0; rank < decode_tp_; ++rank)
      untouched_checks_.push_back(checks_.post(
          [this, &r, rank] {
            const PoolView& pool = *dst_[rank];
            const PoolGeometry& g = pool.geometry();
            for (uint32_t b : r.blocks.dst)
              for (uint32_t l = 0; l < g.total_layers(); ++l)
                for (uint32_t t : tensor_ids(g))
                  if (!block_is_poisoned(pool, l, t, b)) {
                    tally_.add_stray(fmt::format(
                        "decode block {} (rank {}, layer {}) was written while no request owned it",
                        b, rank, l));
                    return;
                  }
          },
          /*urgent=*/true));
  }

  void await_untouched_checks() {
    if (untouched_checks_.empty()) return;
    settle();
    for (IdleQueue::Ticket t : untouched_checks_)
      checks_.wait(t);
    untouched_checks_.clear();
  }

  // Timed windows: from a request's last layer computed to its completion
  // and `arrived` (late decode halves are not timed). The idle queue is
  // paused while one is open (idle_queue.h says why).
  bool quiet() {
    std::erase_if(tails_, [&](const SimRequest* r) {
      return r->completions > 0 && (!o_.expect_arrivals || r->arrivals > 0);
    });
    return tails_.empty();
  }
  // From the start of its last layer: its window opens before the queue is
  // paused, so that nothing resumes the queue in between.
  void open_tail(const SimRequest& r) {
    if (!r.late_dest) tails_.push_back(&r);
  }
  // Waits (reading completions) until no timed window is open, or 2 s at
  // most (a window that does not close is the run's own failure to report;
  // the checks must go on), and lets the idle queue run.
  void settle() {
    const Deadline until = Deadline::after(2s);
    while (!quiet() && fatal_.empty() && !until.passed())
      drain_completions(Deadline::after(1ms));
    tails_.clear();
    checks_.resume();
  }

  void send_dest(SimRequest& r) {
    CacheDestSpec d;
    d.request_id = r.id;
    d.dest_block_ids = r.blocks.dst;
    d.request_nonce = r.nonce;
    d.protocol = protocol();
    d.peer_instance = decode_instance_;
    for (uint32_t rank = 0; rank < tp_; ++rank)
      d.device_ids.push_back(rank);
    if (o_.tcp) {
      d.peer_address = o_.peer_address;
      d.tcp_ports = decode_tcp_ports();
    }
    if (o_.rdma) {
      d.peer_address = o_.peer_address;
      d.rdma_ports = decode_.info().rdma_ports;
    }
    submit(prefill_.submit(d, Deadline::after(10s)), r.id);
    r.dest_sent = true;
  }

  void send_due_dests(uint64_t step) {
    for (auto& [id, r] : requests_) {
      if (!r->dest_sent && r->prefill_done && r->dest_due_step <= step) send_dest(*r);
    }
  }

  std::vector<uint16_t> decode_tcp_ports() const { return decode_.info().tcp_ports; }
  Protocol protocol() const {
    return o_.rdma ? Protocol::kRdma : o_.tcp ? Protocol::kTcp : Protocol::kIpc;
  }

  void submit(const Status& s, const std::string& id) {
    if (s) return;
    if (s.code() == Errc::kCoordinatorGone) stop(s.error().message);
    if (report_.first_error.empty())
      report_.first_error = fmt::format("submit '{}': {}", id, s.error().message);
  }

  // Nothing more can happen (an instance is gone, a pool was truncated):
  // end the run now, saying why, instead of waiting for the timeout.
  void stop(const std::string& why) {
    if (fatal_.empty()) fatal_ = why;
  }

  bool pools_intact() {
    for (const PoolView* pool : all_pools())
        if (Status s = pool->check_intact(); !s) {
          stop(s.error().message);
          return false;
        }
    return true;
  }

  // Writes layer `layer` of blocks [first, last) of `r` on every rank: what
  // the model's attention does when it computes that layer.
  void compute_layer(const SimRequest& r, uint32_t layer, uint32_t first, uint32_t last) {
    for (uint32_t rank = 0; rank < tp_; ++rank)
      fill_blocks_heads(*src_[rank], prefill_.info().first_kv_head(rank), r.blocks, layer, first,
                        last);
  }

  void wait_compute() {
    if (o_.layer_compute_us == 0) return;
    const Deadline until = Deadline::after(std::chrono::microseconds(o_.layer_compute_us));
    while (!until.passed()) {
      drain_completions(Deadline::now());
      if (!until.passed()) std::this_thread::sleep_for(std::min<Nanos>(until.remaining(), 100us));
    }
  }

  void push_layer(uint64_t step, uint32_t layer) {
    for (uint32_t rank = 0; rank < tp_; ++rank)
      submit(prefill_.push_layer_done(rank, step, layer, Deadline::after(10s)), "layer");
  }

  void run_chunk_step(uint64_t step) {
    struct Chunk {
      SimRequest* r;
      uint64_t offset;
      uint64_t len;
    };
    std::vector<Chunk> chunks;
    std::vector<BatchSlot> batch;
    for (SimRequest* r : active_) {
      const uint64_t left = r->tokens - r->prefilled;
      const uint64_t len = o_.chunk_tokens == 0 ? left : std::min<uint64_t>(left, o_.chunk_tokens);
      chunks.push_back({r, r->prefilled, len});
      batch.push_back({r->slot, static_cast<uint32_t>(r->prefilled), static_cast<uint32_t>(len),
                       Client::request_tag(r->id)});
    }
    if (chunks.empty()) return;
    for (uint32_t rank = 0; rank < tp_; ++rank)
      submit(prefill_.push_batch(rank, step, batch, Deadline::after(10s)), "batch");
    uint64_t computed_ns = 0;  // the last layer computed: exposed time counts from here
    for (uint32_t layer = 0; layer < layers_; ++layer) {
      await_untouched_checks();
      if (layer + 1 == layers_) {
        bool ends_a_prefill = false;
        for (const Chunk& c : chunks)
          if (c.offset + c.len == c.r->tokens) {
            open_tail(*c.r);
            ends_a_prefill = true;
          }
        if (ends_a_prefill) checks_.pause();
      }
      wait_compute();
      for (const Chunk& c : chunks) {
        const auto first = static_cast<uint32_t>(c.offset / block_tokens_);
        const auto last =
            static_cast<uint32_t>((c.offset + c.len + block_tokens_ - 1) / block_tokens_);
        compute_layer(*c.r, layer, first,
                      std::min<uint32_t>(last, static_cast<uint32_t>(c.r->blocks.src.size())));
      }
      computed_ns = mono_now_ns();
      if (!o_.send_after_prefill) push_layer(step, layer);
    }
    if (o_.send_after_prefill)
      for (uint32_t layer = 0; layer < layers_; ++layer)
        push_layer(step, layer);
    const uint64_t now = computed_ns;
    for (const Chunk& c : chunks) {
      c.r->prefilled += c.len;
      if (c.r->prefilled == c.r->tokens) finish_prefill(*c.r, step, now);
    }
    std::erase_if(active_, [](const SimRequest* r) { return r->prefill_done; });
  }

  void run_legacy_step(uint64_t step) {
    std::vector<SimRequest*> batch(active_.begin(), active_.end());
    if (batch.empty()) return;
    uint64_t computed_ns = 0;
    for (uint32_t layer = 0; layer < layers_; ++layer) {
      await_untouched_checks();
      if (layer + 1 == layers_) {
        for (SimRequest* r : batch)
          open_tail(*r);
        checks_.pause();
      }
      wait_compute();
      for (SimRequest* r : batch)
        compute_layer(*r, layer, 0, static_cast<uint32_t>(r->blocks.src.size()));
      computed_ns = mono_now_ns();
      for (uint32_t rank = 0; rank < tp_; ++rank)
        submit(prefill_.push_legacy_layer_done(rank, step, layer, Deadline::after(10s)),
               "legacy layer");
    }
    const uint64_t now = computed_ns;
    for (SimRequest* r : batch) {
      r->prefilled = r->tokens;
      finish_prefill(*r, step, now);
    }
    active_.clear();
  }

  void finish_prefill(SimRequest& r, uint64_t step, uint64_t now) {
    trace("prefilled", r.id);
    r.prefill_done = true;
    r.last_signal_ns = now;
    r.dest_due_step = step + o_.late_dest_steps;
  }

  uint32_t expected_arrivals() const { return o_.expect_arrivals ? o_.requests : 0; }

  // Reads what has come in; the idle queue goes on once no window is open.
  void drain_completions(Deadline until) {
    read_completions(until);
    if (quiet()) checks_.resume();
  }

  void read_completions(Deadline until) {
    while (fatal_.empty() && o_.expect_arrivals) {
      Result<std::optional<Completion>> c = decode_.poll();
      if (!c) {
        stop(c.error().message);
        return;
      }
      if (!c->has_value()) break;
      on_arrival(**c);
    }
    while (fatal_.empty()) {
      Result<Completion> c = until.passed() ? poll_once() : prefill_.wait(until);
      if (!c) {
        if (c.code() != Errc::kTimeout) stop(c.error().message);
        return;
      }
      on_completion(*c);
      until = Deadline::now();
    }
  }

  Result<Completion> poll_once() {
    Result<std::optional<Completion>> c = prefill_.poll();
    if (!c) return c.error();
    if (!c->has_value()) return make_error(Errc::kTimeout, "none");
    return std::move(**c);
  }

  void on_completion(const Completion& c) {
    auto it = requests_.find(c.request_id);
    if (it == requests_.end()) {
      ++report_.missing_or_extra;
      if (report_.first_error.empty())
        report_.first_error =
            fmt::format("completion for unknown request '{}': {} {}", c.request_id,
                        completion_status_name(c.status), c.message);
      return;
    }
    SimRequest& r = *it->second;
    trace(fmt::format("completion ({}, written by the coordinator at {} us)",
                      completion_status_name(c.status), c.completed_ns / 1000),
          r.id);
    if (++r.completions != 1) return;
    ++finished_count_;
    // A request that failed on the prefill side will not arrive: the
    // decode engine withdraws its declaration (and gets `cancelled`).
    if (o_.expect_arrivals && c.status != CompletionStatus::kFinished && r.arrivals == 0)
      (void)decode_.cancel(r.id, Deadline::after(10s));
    if (c.status != CompletionStatus::kFinished) {
      ++report_.failed;
      if (c.status == CompletionStatus::kError && c.error_rank >= 0) ++report_.failed_naming_a_rank;
      if (c.status == CompletionStatus::kTimeout) ++report_.timeouts;
      if (report_.first_error.empty() && !(o_.kill_every_ms != 0 && c.error_rank >= 0))
        report_.first_error =
            fmt::format("'{}' {}: {}", r.id, completion_status_name(c.status), c.message);
    } else {
      if (!pools_intact()) return;
      ++report_.finished;
      report_.bytes += c.bytes_moved;
      // Exposed transfer time: only for requests whose decode half was there
      // before their prefill ended (the late ones wait for it by design).
      if (!r.late_dest && r.last_signal_ns != 0)
        exposed_.push_back(c.completed_ns > r.last_signal_ns ? c.completed_ns - r.last_signal_ns
                                                             : 0);
      r.verify = true;  // every byte, when its blocks are released
      if (o_.inject_fault == SimOptions::Fault::kCorrupt && report_.finished == 1 &&
          !r.blocks.dst.empty())
        write_wrong_word(*dst_[0], r.blocks.dst[0]);
    }
    std::erase(active_, &r);
    release(r);
  }

  // The decode engine's completion of an expected request.
  void on_arrival(const Completion& c) {
    // The answer to a cancel that raced the request's own end (it had
    // arrived, or failed on the decode side, already): not the request's.
    if (c.kind == CompletionKind::kCancel && c.status == CompletionStatus::kRejected) return;
    auto it = requests_.find(c.request_id);
    if (it == requests_.end() || c.kind != CompletionKind::kArrived) {
      ++report_.missing_or_extra;
      if (report_.first_error.empty())
        report_.first_error =
            fmt::format("unexpected decode-side completion for '{}': {} {}", c.request_id,
                        completion_status_name(c.status), c.message);
      return;
    }
    SimRequest& r = *it->second;
    trace(fmt::format("arrived ({})", completion_status_name(c.status)), r.id);
    if (++r.arrivals != 1) return;
    ++arrived_count_;
    if (c.status == CompletionStatus::kFinished) {
      ++report_.arrived;
      // The decode engine's exposed time: from the prefill engine's last
      // layer to `arrived` (both stamps CLOCK_MONOTONIC on this host), for
      // requests declared before their prefill ended, as above.
      if (!r.late_dest && r.last_signal_ns != 0)
        exposed_arrival_.push_back(
            c.completed_ns > r.last_signal_ns ? c.completed_ns - r.last_signal_ns : 0);
    } else if (report_.first_error.empty() && o_.kill_every_ms == 0) {
      report_.first_error =
          fmt::format("'{}' arrived {}: {}", r.id, completion_status_name(c.status), c.message);
    }
    release(r);
  }

  // Hands the blocks back poisoned, as an engine frees them, once every
  // completion the request gets is in; a finished request's destination
  // bytes are checked first. Both run on the idle queue, one job per pool
  // (the check and then the poisoning of a pool in one job: the queue's
  // jobs may run out of order), and the blocks go back to the allocators
  // once they have (collect_released).
  void release(SimRequest& r) {
    if (r.released || r.completions == 0 || (o_.expect_arrivals && r.arrivals == 0)) return;
    r.released = true;
    std::vector<IdleQueue::Ticket> poisoned;
    for (const auto& src : src_)
      poisoned.push_back(
          checks_.post([pool = src.get(), &r] { poison_request_blocks(*pool, r.blocks.src); }));
    for (uint32_t rank = 0; rank < decode_tp_; ++rank)
      poisoned.push_back(checks_.post([this, &r, rank] {
        const PoolView& pool = *dst_[rank];
        if (r.verify) {
          const uint64_t wrong =
              check_request_heads(pool, decode_.info().first_kv_head(rank), r.blocks);
          if (wrong != 0)
            tally_.add_wrong(wrong,
                             fmt::format("'{}': {} wrong words on rank {}", r.id, wrong, rank));
        }
        poison_request_blocks(pool, r.blocks.dst);
      }));
    releasing_.emplace_back(std::move(poisoned), &r);
  }

  // --inject-fault: one word of layer 0's first tensor, neither the poison
  // nor any request's pattern.
  static void write_wrong_word(const PoolView& pool, uint32_t block_id) {
    std::byte* p = pool.block(0, static_cast<PoolTensor>(tensor_ids(pool.geometry())[0]), block_id);
    if (p == nullptr) return;
    const uint64_t wrong = 0x0bad'0bad'0bad'0badULL;
    std::memcpy(p, &wrong, sizeof wrong);
  }

  static void poison_request_blocks(const PoolView& pool, const std::vector<uint32_t>& blocks) {
    const PoolGeometry& g = pool.geometry();
    for (uint32_t b : blocks)
      for (uint32_t l = 0; l < g.total_layers(); ++l)
        for (uint32_t t : tensor_ids(g))
          poison_block(pool, l, t, b);
  }

  // Gives the allocators the blocks whose poisoning has run.
  void collect_released() {
    while (!releasing_.empty() &&
           std::ranges::all_of(releasing_.front().first, [&](auto t) { return checks_.done(t); })) {
      const SimRequest& r = *releasing_.front().second;
      src_alloc_->give_back(r.blocks.src);
      dst_alloc_->give_back(r.blocks.dst);
      releasing_.pop_front();
    }
  }

  void trace(const std::string& what, const std::string& id) {
    if (o_.trace) fmt::print(stderr, "{} us: {} {}\n", mono_now_ns() / 1000, id, what);
  }

  void draw_progress() {
    if (!o_.progress) return;
    const uint32_t width = 40;
    const uint32_t filled = o_.requests == 0 ? width : finished_count_ * width / o_.requests;
    fmt::print(stderr, "\r[{}{}] {}/{} requests, {:.1f} MiB moved", std::string(filled, '='),
               std::string(width - filled, ' '), finished_count_, o_.requests,
               report_.bytes / 1048576.0);
  }

  std::string decode_instance_;
  const SimOptions& o_;
  Client& prefill_;
  Client& decode_;
  std::mt19937_64 rng_;
  uint32_t tp_ = 1;
  uint32_t decode_tp_ = 1;
  uint32_t layers_ = 1;
  uint32_t block_tokens_ = 1;
  std::vector<std::unique_ptr<PoolView>> src_;
  std::vector<std::unique_ptr<PoolView>> dst_;
  std::unique_ptr<BlockAllocator> src_alloc_;
  std::unique_ptr<BlockAllocator> dst_alloc_;
  std::map<std::string, std::unique_ptr<SimRequest>> requests_;
  std::vector<SimRequest*> active_;
  uint32_t admitted_ = 0;
  uint32_t finished_count_ = 0;
  std::vector<uint64_t> exposed_;
  std::vector<uint64_t> exposed_arrival_;
  SimReport report_;
  std::string fatal_;
  uint32_t arrived_count_ = 0;  // requests with their `arrived` completion
  // The simulator's own checks and poisoning, off the engine thread (see
  // idle_queue.h). Declared last: it finishes its jobs before the pools,
  // allocators and requests they use go.
  CheckTally tally_;
  IdleQueue checks_;
  // New requests' checks that their layer signals wait for.
  std::vector<IdleQueue::Ticket> untouched_checks_;
  std::vector<const SimRequest*> tails_;  // timed windows still open (quiet())
  // Released requests whose poisoning is queued: (its jobs, request).
  std::deque<std::pair<std::vector<IdleQueue::Ticket>, const SimRequest*>> releasing_;
};

}  // namespace

std::string SimReport::summary() const {
  std::string s;
  s += fmt::format(
      "requests          {} ({} finished, {} failed, {} without exactly one completion)\n",
      requests, finished, failed, missing_or_extra);
  if (expect_arrivals)
    s += fmt::format(
        "arrived           {} of {} expected requests completed `arrived` on the "
        "decode side\n",
        arrived, requests);
  s += fmt::format("bytes moved       {:.1f} MiB in {:.2f} s ({:.2f} GB/s over the whole run)\n",
                   bytes / 1048576.0, seconds, seconds > 0 ? bytes / seconds / 1e9 : 0);
  s += fmt::format("signal -> copied  {} (layer signal to that layer's copy done)\n",
                   us_quantiles(signal_to_copy));
  s += fmt::format(
      "exposed transfer  {} from the last layer computed to the completion (one layer's "
      "copy: p50 {:.1f} us)\n",
      us_quantiles(exposed), layer_copy.p50 / 1e3);
  if (expect_arrivals)
    s += fmt::format(
        "exposed arrival   {} from the last layer computed to `arrived` on the decode "
        "side\n",
        us_quantiles(exposed_arrival));
  s += fmt::format(
      "completion hops   p50 {:.1f} / {:.1f} / {:.1f} / {:.1f} us: layer signal pushed -> "
      "worker read, read -> copied, report written -> coordinator read, -> completion "
      "written (every layer and report of the run)\n",
      signal_wake.p50 / 1e3, signal_to_copy.p50 / 1e3, report_hop.p50 / 1e3, publish_hop.p50 / 1e3);
  s += fmt::format(
      "tail hops         p50 {:.1f} / {:.1f} / {:.1f} us: a request's last layer signal pushed -> "
      "each rank's finished report, the report that finished it -> coordinator read, -> "
      "completion written\n",
      tail_to_report.p50 / 1e3, tail_report_hop.p50 / 1e3, publish_hop.p50 / 1e3);
  if (expect_arrivals && arrival_tail_to_report.p50 > 0)  // over ipc: tcp's writes carry no stamp
    s += fmt::format(
        "decode tail hops  p50 {:.1f} / {:.1f} / {:.1f} us: a request's last landed write -> "
        "each decode rank's arrived report, the report that completed it -> decode coordinator "
        "read, -> `arrived` written (a landed record's read by its decode rank, every record: "
        "p50 {:.1f} us)\n",
        arrival_tail_to_report.p50 / 1e3, arrival_tail_report_hop.p50 / 1e3,
        arrival_publish_hop.p50 / 1e3, landed_wake.p50 / 1e3);
  s +=
      fmt::format("verification      {} wrong words, {} blocks written outside their request: {}\n",
                  wrong_words, stray_blocks,
                  wrong_words != 0 || stray_blocks != 0 ? "FAILED"
                  : finished != 0 ? "every byte of every finished request verified"
                                  : "nothing finished to verify");
  if (aborted) s += "run               ABORTED (see the first problem)\n";
  if (soak)
    s += fmt::format(
        "soak tally        requests {}, kills {}, finished {}, errors {} ({} naming the "
        "killed rank), timeouts {}, without exactly one completion {}, hangs {}, byte "
        "errors in finished requests {}, ranks not serving again after the kills {}\n",
        requests, kills, finished, failed - timeouts, failed_naming_a_rank, timeouts,
        missing_or_extra, timed_out ? 1 : 0, wrong_words, ranks_not_back.size());
  if (soak && !ranks_not_back.empty())
    s += fmt::format(
        "soak              FAILED: not serving again 30 s after the last kill: {} (its "
        "supervisor gave it up: see its coordinator's log)\n",
        fmt::join(ranks_not_back, ", "));
  if (soak && finished < min_finished)
    s += fmt::format(
        "soak              FAILED: {} finished, fewer than --min-finished {} ({})\n", finished,
        min_finished,
        min_finished > requests
            ? fmt::format("more than the {} requests run", requests)
            : std::string(
                  "the kills left too little time between them for a transfer to complete"));
  if (!first_error.empty()) s += fmt::format("first problem     {}\n", first_error);
  return s;
}

SimReport run_simulation(const SimOptions& options, Client& prefill, Client& decode,
                         const std::string& prefill_instance, const std::string& decode_instance) {
  Simulation sim(options, prefill, decode, decode_instance);
  return sim.run(prefill_instance);
}

}  // namespace kvrelay::sim

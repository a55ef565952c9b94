// A prefill instance and a decode instance on this host, each with its own
// coordinator and workers (real processes), plus the engine-side helpers the
// tests need: submit both halves, push a whole prefill's signals, wait for a
// request's completion, and check every destination byte.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "instance/control_layout.h"
#include "instance/control_segment.h"
#include "instance/pool_segment.h"
#include "kv_pattern.h"
#include "kvrelay/client.h"
#include "shm/counters.h"
#include "support/instance.h"
#include "support/processes.h"

namespace kvrelay::testing {

// Where each instance runs and with which extra flags (the tcp tests put
// them in two network namespaces).
struct Placement {
  std::vector<std::string> decode_prefix, prefill_prefix;
  std::vector<std::string> decode_extra, prefill_extra;
  // Heterogeneous TP: the decode instance's own TP size and heads per rank
  // (0: as the prefill instance's).
  uint32_t decode_tp = 0, decode_kv_heads = 0;
  uint32_t decode_head_dim = 0;  // a mismatch, for the tests of refusals
  // --pool none on both: the engines register every pool, and src_pool /
  // dst_pool are not there to use.
  bool engine_pools = false;
};

// How the prefill instance reaches the decode one: ipc (default) or tcp.
struct Route {
  Protocol protocol = Protocol::kIpc;
  std::string address;          // tcp
  std::vector<uint16_t> ports;  // tcp: per decode rank
};

class TwoInstances {
 public:
  TwoInstances(const std::string& tag, InstanceArgs base, const Placement& where = {}) {
    if (where.engine_pools) base.extra.insert(base.extra.end(), {"--pool", "none"});
    const std::vector<std::string> extra = base.extra;
    base.instance = unique_instance(tag + "-d");
    base.role = "decode";
    base.prefix = where.decode_prefix;
    base.extra.insert(base.extra.end(), where.decode_extra.begin(), where.decode_extra.end());
    const InstanceArgs prefill_base = base;
    if (where.decode_tp != 0) base.tp = where.decode_tp;
    if (where.decode_kv_heads != 0) base.kv_heads = where.decode_kv_heads;
    if (where.decode_head_dim != 0) base.head_dim = where.decode_head_dim;
    decode_ = Instance::start(base);
    decode_tp_ = base.tp;
    base.tp = prefill_base.tp;
    base.kv_heads = prefill_base.kv_heads;
    base.head_dim = prefill_base.head_dim;
    base.instance = unique_instance(tag + "-p");
    base.role = "prefill";
    base.prefix = where.prefill_prefix;
    base.extra = extra;
    base.extra.insert(base.extra.end(), where.prefill_extra.begin(), where.prefill_extra.end());
    prefill_ = Instance::start(base);
    tp_ = base.tp;
    if (where.engine_pools) return;
    for (uint32_t r = 0; r < tp_; ++r)
      src_.push_back(std::make_unique<PoolView>(
          std::move(prefill_->client().open_pool(r, PoolTier::kDevice)).value()));
    for (uint32_t r = 0; r < decode_tp_; ++r)
      dst_.push_back(std::make_unique<PoolView>(
          std::move(decode_->client().open_pool(r, PoolTier::kDevice)).value()));
  }

  // Stops both instances; each must exit 0 and leave nothing in /dev/shm.
  void stop_and_check_clean() {
    EXPECT_EQ(prefill_->stop(), 0);
    EXPECT_EQ(decode_->stop(), 0);
    EXPECT_TRUE(prefill_->leftover_segments().empty());
    EXPECT_TRUE(decode_->leftover_segments().empty());
  }

  Client& engine() { return prefill_->client(); }
  Instance& prefill() { return *prefill_; }
  Instance& decode() { return *decode_; }
  uint32_t tp() const { return tp_; }
  uint32_t decode_tp() const { return decode_tp_; }
  // The model KV head of head 0 of each side's rank (heterogeneous TP).
  uint32_t src_first_head(uint32_t r) { return prefill_->client().info().first_kv_head(r); }
  uint32_t dst_first_head(uint32_t r) { return decode_->client().info().first_kv_head(r); }
  const PoolView& src_pool(uint32_t r) const { return *src_[r]; }
  const PoolView& dst_pool(uint32_t r) const { return *dst_[r]; }

  void fill(const sim::RequestBlocks& r) {
    for (uint32_t rank = 0; rank < tp_; ++rank)
      sim::fill_request(*src_[rank], rank, r);
  }
  uint64_t wrong_words(const sim::RequestBlocks& r) {
    uint64_t wrong = 0;
    for (uint32_t rank = 0; rank < tp_; ++rank)
      wrong += sim::check_request(*dst_[rank], rank, r);
    return wrong;
  }

  Status submit_task(const std::string& id, const sim::RequestBlocks& r, uint64_t tokens,
                     uint32_t slot, uint32_t deadline_ms = 0) {
    CacheTaskSpec t;
    t.request_id = id;
    t.src_block_ids = r.src;
    t.need_prefill_tokens = tokens;
    t.engine_slot = slot;
    t.deadline_ms = deadline_ms;
    return engine().submit(t, Deadline::after(std::chrono::seconds(5)));
  }
  Status submit_dest(const std::string& id, const sim::RequestBlocks& r) {
    CacheDestSpec d;
    d.request_id = id;
    d.dest_block_ids = r.dst;
    d.protocol = route_.protocol;
    d.peer_instance = decode_->name();
    d.peer_address = route_.address;
    d.tcp_ports = route_.ports;
    for (uint32_t rank = 0; rank < tp_; ++rank)
      d.device_ids.push_back(rank);
    return engine().submit(d, Deadline::after(std::chrono::seconds(5)));
  }
  void set_route(Route route) { route_ = std::move(route); }
  const Route& route() const { return route_; }
  // One step on every rank: the batch, then every layer.
  void prefill_step(uint64_t step, const std::vector<BatchSlot>& batch, uint32_t layers) {
    for (uint32_t rank = 0; rank < tp_; ++rank) {
      ASSERT_TRUE(
          engine().push_batch(rank, step, batch, Deadline::after(std::chrono::seconds(5))).ok());
      for (uint32_t l = 0; l < layers; ++l)
        ASSERT_TRUE(
            engine().push_layer_done(rank, step, l, Deadline::after(std::chrono::seconds(5))).ok());
    }
  }
  // A whole request of `block_tokens`-token blocks: its bytes, both halves,
  // and one step of slot `slot` through every one of `layers`.
  void send_whole_request(const std::string& id, const sim::RequestBlocks& r, uint64_t step,
                          uint32_t slot, uint32_t layers, uint32_t block_tokens = 16) {
    fill(r);
    const auto tokens = static_cast<uint32_t>(r.src.size() * block_tokens);
    ASSERT_TRUE(submit_task(id, r, tokens, slot).ok());
    ASSERT_TRUE(submit_dest(id, r).ok());
    prefill_step(step, {{slot, 0, tokens, Client::request_tag(id)}}, layers);
  }
  // Waits for the completion of `id`, keeping others for later.
  Completion wait_for(const std::string& id,
                      std::chrono::milliseconds within = std::chrono::seconds(20)) {
    auto it = seen_.find(id);
    if (it != seen_.end()) {
      Completion c = it->second;
      seen_.erase(it);
      return c;
    }
    const Deadline until = Deadline::after(within);
    for (;;) {
      Result<Completion> c = engine().wait(until);
      if (!c) {
        Completion fail;
        fail.request_id = id;
        fail.message = "no completion: " + c.error().message;
        fail.status = CompletionStatus::kError;
        return fail;
      }
      if (c->request_id == id) return *c;
      seen_.emplace(c->request_id, *c);
    }
  }
  // Completions that arrived while waiting for others.
  std::multimap<std::string, Completion>& others() { return seen_; }

 private:
  std::unique_ptr<Instance> decode_;
  std::unique_ptr<Instance> prefill_;
  uint32_t tp_ = 1;
  uint32_t decode_tp_ = 1;
  std::vector<std::unique_ptr<PoolView>> src_;
  std::vector<std::unique_ptr<PoolView>> dst_;
  std::multimap<std::string, Completion> seen_;
  Route route_;
};

// What `kvrelay-dump ARGS...` printed; its exit code in `*code`.
inline std::string kvrelay_dump(const std::vector<std::string>& args, int* code = nullptr) {
  std::vector<std::string> argv = {Instance::bin("kvrelay-dump")};
  argv.insert(argv.end(), args.begin(), args.end());
  std::string out;
  const int rc = run_program(argv, &out);
  if (code != nullptr) *code = rc;
  return out;
}

// The sum over an instance's workers of their counter `label`
// (worker/worker_counters.h); 0 when the instance is gone.
inline uint64_t worker_counter_sum(const std::string& instance, const std::string& label) {
  auto c = ControlSegment::attach(instance, AttachOptions{.access = SegmentAccess::kReadOnly});
  if (!c) return 0;
  uint64_t total = 0;
  for (uint32_t r = 0; r < c->config().tp_size; ++r)
    for (const auto& [name, value] :
         snapshot_counters(c->counters(worker_counters_index(r))).counters)
      if (name == label) total += value;
  return total;
}

}  // namespace kvrelay::testing

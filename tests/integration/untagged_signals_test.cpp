// Untagged layer signals (the original's protocol: batch entries without a
// request tag) under load, against real coordinator and worker processes.
// Several engines, each an engine process on its own
// prefill/decode pair, run at once on this machine's cores. Each pushes
// untagged batches right after submitting the tasks they cover; most
// requests' only chunk is their final one at an offset above 0 (the prefill
// side holds a cached prefix); other slots see cancels (whose layer records
// still arrive after the cancel, as a forward pass already enqueued does)
// and stalls (a chunk that never completes, failed at its deadline); every
// slot is reused at once.
//
// Every request must get exactly one completion of the status its kind
// allows, every finished request's bytes must be at the decode side, and
// nothing may hang: a request whose signals were attributed elsewhere would
// wait for its deadline and complete as a timeout.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "integration/two_instances.h"

namespace kvrelay::testing {
namespace {

using namespace std::chrono_literals;

constexpr uint32_t kLayers = 4;
constexpr uint32_t kBlockTokens = 4;
constexpr uint32_t kSlots = 16;
constexpr uint32_t kBlocks = 256;
constexpr uint32_t kStallDeadlineMs = 300;

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr uint32_t kRequestsPerEngine = 400;
#else
constexpr uint32_t kRequestsPerEngine = 1500;
#endif
constexpr uint32_t kEngines = 3;

enum class Kind {
  kFinalAfterPrefix,  // one chunk, the final one, at an offset above 0
  kWhole,             // one chunk from token 0
  kCancelled,         // like kFinalAfterPrefix, cancelled between its batch and its layers
  kStalled,           // a first chunk only: never complete, fails at its deadline
};

struct Live {
  Kind kind;
  uint32_t slot;
  sim::RequestBlocks blocks;
};

// A free list of block ids.
class Blocks {
 public:
  explicit Blocks(uint32_t n) {
    for (uint32_t b = n; b > 0; --b)
      free_.push_back(b - 1);
  }
  bool take(uint32_t n, std::vector<uint32_t>& out) {
    if (free_.size() < n) return false;
    out.assign(free_.end() - n, free_.end());
    free_.resize(free_.size() - n);
    return true;
  }
  void give(const std::vector<uint32_t>& ids) { free_.insert(free_.end(), ids.begin(), ids.end()); }

 private:
  std::vector<uint32_t> free_;
};

// One engine process: drives `requests` requests through `env`'s prefill
// instance with its own Client. Returns the number of problems found (each
// printed), 0 when every request ended as its kind allows.
int run_engine(TwoInstances& env, uint32_t engine_id, uint32_t requests) {
  Result<Client> attached = Client::attach(env.prefill().name(), Deadline::after(30s));
  if (!attached) {
    std::fprintf(stderr, "engine %u: attach: %s\n", engine_id, attached.error().message.c_str());
    return 1;
  }
  Client& c = *attached;
  const uint32_t tp = env.tp();
  std::mt19937 rng(1234 + engine_id);
  auto pick = [&](uint32_t lo, uint32_t hi) {
    return std::uniform_int_distribution<uint32_t>(lo, hi)(rng);
  };
  Blocks src(kBlocks), dst(kBlocks);
  std::vector<uint32_t> free_slots;
  for (uint32_t s = kSlots; s > 0; --s)
    free_slots.push_back(s - 1);
  std::map<std::string, Live> live;
  std::map<std::string, int> completions;
  int problems = 0;
  auto problem = [&](const std::string& what) {
    if (++problems <= 20) std::fprintf(stderr, "engine %u: %s\n", engine_id, what.c_str());
  };
  std::map<Kind, uint32_t> started;
  uint64_t step = 0;
  uint64_t tag = uint64_t{engine_id} << 32;

  std::set<std::string> cancelled_ids;
  auto on_completion = [&](const Completion& done) {
    if (done.kind == CompletionKind::kCancel) {
      // The answer to a cancel that came after its request had ended: the
      // request's own completion is separate (and counted below).
      if (done.status != CompletionStatus::kRejected || cancelled_ids.count(done.request_id) == 0)
        problem("an unexpected cancel answer for '" + done.request_id + "' (" +
                completion_status_name(done.status) + ": " + done.message + ")");
      return;
    }
    ++completions[done.request_id];
    auto it = live.find(done.request_id);
    if (it == live.end()) {
      problem("a completion for '" + done.request_id + "', which is not live (" +
              completion_status_name(done.status) + ": " + done.message + ")");
      return;
    }
    Live& r = it->second;
    const CompletionStatus s = done.status;
    bool allowed = false;
    switch (r.kind) {
      case Kind::kFinalAfterPrefix:
      case Kind::kWhole: allowed = s == CompletionStatus::kFinished; break;
      case Kind::kCancelled:
        allowed = s == CompletionStatus::kCancelled || s == CompletionStatus::kFinished;
        break;
      case Kind::kStalled: allowed = s == CompletionStatus::kTimeout; break;
    }
    if (!allowed)
      problem("'" + done.request_id + "' (slot " + std::to_string(r.slot) + ") ended " +
              completion_status_name(s) + ": " + done.message);
    if (s == CompletionStatus::kFinished && env.wrong_words(r.blocks) != 0)
      problem("'" + done.request_id + "' finished with wrong bytes at the decode side");
    src.give(r.blocks.src);
    dst.give(r.blocks.dst);
    if (r.kind != Kind::kCancelled) free_slots.push_back(r.slot);  // a cancel freed it already
    live.erase(it);
  };
  auto drain = [&](Deadline until) {
    for (;;) {
      Result<std::optional<Completion>> got = c.poll();
      if (!got) {
        problem("poll: " + got.error().message);
        return;
      }
      if (got->has_value()) {
        on_completion(**got);
        continue;
      }
      if (until.passed()) return;
      Result<Completion> waited = c.wait(until);
      if (waited) on_completion(*waited);
      return;
    }
  };

  uint32_t submitted = 0;
  while (submitted < requests) {
    // A step: up to 4 new requests, each in a free slot.
    std::vector<BatchSlot> batch;
    std::vector<std::string> to_cancel;
    const uint32_t want = std::min<uint32_t>(pick(1, 4), requests - submitted);
    for (uint32_t i = 0; i < want && !free_slots.empty(); ++i) {
      const uint32_t tokens = pick(11, 26);
      const uint32_t n = (tokens + kBlockTokens - 1) / kBlockTokens;
      const uint32_t roll = pick(0, 99);
      const Kind kind = roll < 60   ? Kind::kFinalAfterPrefix
                        : roll < 70 ? Kind::kWhole
                        : roll < 85 ? Kind::kCancelled
                                    : Kind::kStalled;
      // The decode side holds a prefix sometimes (a shorter destination list).
      const uint32_t decode_prefix = pick(0, 3) == 0 ? pick(0, n - 1) : 0;
      Live r{kind, free_slots.back(), {}};
      if (!src.take(n, r.blocks.src)) break;
      if (!dst.take(n - decode_prefix, r.blocks.dst)) {
        src.give(r.blocks.src);
        break;
      }
      free_slots.pop_back();
      r.blocks.tag = ++tag;
      env.fill(r.blocks);
      const std::string id = "e" + std::to_string(engine_id) + "-r" + std::to_string(submitted++);
      // The prefill side's cached prefix: 1..n-1 blocks of the request.
      const uint32_t cached_tokens = pick(1, (tokens - 1) / kBlockTokens) * kBlockTokens;
      BatchSlot entry{r.slot, 0, tokens, 0};
      if (kind == Kind::kFinalAfterPrefix || kind == Kind::kCancelled)
        entry = BatchSlot{r.slot, cached_tokens, tokens - cached_tokens, 0};
      if (kind == Kind::kStalled) entry = BatchSlot{r.slot, 0, kBlockTokens, 0};

      CacheDestSpec d;
      d.request_id = id;
      d.dest_block_ids = r.blocks.dst;
      d.protocol = Protocol::kIpc;
      d.peer_instance = env.decode().name();
      for (uint32_t rank = 0; rank < tp; ++rank)
        d.device_ids.push_back(rank);
      CacheTaskSpec t;
      t.request_id = id;
      t.src_block_ids = r.blocks.src;
      t.need_prefill_tokens = tokens;
      t.engine_slot = r.slot;
      if (kind == Kind::kStalled) t.deadline_ms = kStallDeadlineMs;
      if (Status s = c.submit(d, Deadline::after(10s)); !s)
        problem("submit dest: " + s.error().message);
      if (Status s = c.submit(t, Deadline::after(10s)); !s)
        problem("submit task: " + s.error().message);
      batch.push_back(entry);
      if (kind == Kind::kCancelled) to_cancel.push_back(id);
      ++started[kind];
      live.emplace(id, std::move(r));
    }
    if (!batch.empty()) {
      ++step;
      for (uint32_t rank = 0; rank < tp; ++rank)
        if (Status s = c.push_batch(rank, step, batch, Deadline::after(10s)); !s)
          problem("push_batch: " + s.error().message);
      // The engine aborts these while the step's forward pass is already
      // enqueued: their slots are free at once, their layers still signal.
      for (const std::string& id : to_cancel) {
        if (Status s = c.cancel(id, Deadline::after(10s)); !s)
          problem("cancel: " + s.error().message);
        cancelled_ids.insert(id);
        free_slots.push_back(live.at(id).slot);
      }
      for (uint32_t l = 0; l < kLayers; ++l)
        for (uint32_t rank = 0; rank < tp; ++rank)
          if (Status s = c.push_layer_done(rank, step, l, Deadline::after(10s)); !s)
            problem("push_layer_done: " + s.error().message);
    }
    drain(batch.empty() ? Deadline::after(50ms) : Deadline::now());
    if (problems > 50) break;
  }
  // Everything left must end: finished requests at once, stalled ones at
  // their deadline. A request whose signals went elsewhere would end only at
  // the instance's deadline (60 s), as a timeout: the wait stops before it.
  const Deadline settle = Deadline::after(40s);
  while (!live.empty() && !settle.passed())
    drain(settle);
  for (const auto& [id, r] : live)
    problem("'" + id + "' (slot " + std::to_string(r.slot) + ", kind " +
            std::to_string(static_cast<int>(r.kind)) + ") never completed");
  for (const auto& [id, n] : completions)
    if (n != 1) problem("'" + id + "' completed " + std::to_string(n) + " times");
  if (completions.size() != submitted)
    problem(std::to_string(completions.size()) + " requests completed of " +
            std::to_string(submitted) + " submitted");
  std::fprintf(stderr,
               "engine %u: %u requests (%u final chunks after a cached prefix, %u whole, %u "
               "cancelled, %u stalled), %d problems\n",
               engine_id, submitted, started[Kind::kFinalAfterPrefix], started[Kind::kWhole],
               started[Kind::kCancelled], started[Kind::kStalled], problems);
  return std::min(problems, 98);
}

TEST(UntaggedSignals, EveryRequestCompletesOnceWhenFinalChunksFollowCachedPrefixesUnderLoad) {
  InstanceArgs a;
  a.tp = 2;
  a.layers = kLayers;
  a.blocks = kBlocks;
  a.block_size = kBlockTokens;
  a.head_dim = 16;
  a.deadline_ms = 60'000;
  std::vector<std::unique_ptr<TwoInstances>> pairs;
  for (uint32_t e = 0; e < kEngines; ++e)
    pairs.push_back(std::make_unique<TwoInstances>("untag" + std::to_string(e), a));
  std::vector<pid_t> engines;
  for (uint32_t e = 0; e < kEngines; ++e)
    engines.push_back(fork_child([&, e] { return run_engine(*pairs[e], e, kRequestsPerEngine); }));
  for (uint32_t e = 0; e < kEngines; ++e) {
    const std::optional<ChildExit> exit = wait_child(engines[e], 280s);
    ASSERT_TRUE(exit.has_value()) << "engine " << e << " hung";
    EXPECT_TRUE(exit->exited && exit->code == 0)
        << "engine " << e << " found " << exit->code << " problems (see its output above)";
  }
  for (auto& p : pairs)
    p->stop_and_check_clean();
}

}  // namespace
}  // namespace kvrelay::testing

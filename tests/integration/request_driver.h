// Drives requests through a TwoInstances pair the way an engine does: makes
// requests of fresh blocks (filled on the prefill side), submits both halves
// and a batch, signals layers, and checks that nothing outside finished
// requests' destination blocks changed (every decode block starts
// poisoned).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "integration/two_instances.h"

namespace kvrelay::testing {

class RequestDriver {
 public:
  // The pair these tests use: tp 2, 4 layers, 128 blocks of 16 tokens.
  static constexpr uint32_t kLayers = 4;
  static constexpr uint32_t kBlockTokens = 16;
  static InstanceArgs small_pair() {
    InstanceArgs a;
    a.tp = 2;
    a.layers = kLayers;
    a.blocks = 128;
    a.block_size = kBlockTokens;
    a.head_dim = 64;
    return a;
  }

  RequestDriver(TwoInstances& env, uint32_t layers, uint32_t block_tokens)
      : env_(env), layers_(layers), block_tokens_(block_tokens) {
    for (uint32_t rank = 0; rank < env_.tp(); ++rank) {
      const PoolView& dst = env_.dst_pool(rank);
      for (uint32_t l = 0; l < layers_; ++l)
        for (uint32_t t = 0; t < 2; ++t)
          for (uint32_t b = 0; b < dst.geometry().num_blocks; ++b)
            sim::poison_block(dst, l, t, b);
    }
  }

  // A request of `n` blocks, all filled on the prefill side.
  sim::RequestBlocks blocks(uint32_t n) {
    sim::RequestBlocks r;
    r.tag = ++next_tag_;
    for (uint32_t i = 0; i < n; ++i) {
      r.src.push_back(next_src_++);
      r.dst.push_back(next_dst_++);
    }
    env_.fill(r);
    return r;
  }
  // Both halves and a batch that prefills the whole request in one step.
  void submit(const std::string& id, const sim::RequestBlocks& r, uint32_t slot) {
    ASSERT_TRUE(env_.submit_task(id, r, r.src.size() * block_tokens_, slot));
    ASSERT_TRUE(env_.submit_dest(id, r));
    current_step_ = ++step_;
    const std::vector<BatchSlot> batch = {
        {slot, 0, static_cast<uint32_t>(r.src.size() * block_tokens_), Client::request_tag(id)}};
    for (uint32_t rank = 0; rank < env_.tp(); ++rank)
      ASSERT_TRUE(env_.engine().push_batch(rank, current_step_, batch,
                                           Deadline::after(std::chrono::seconds(5))));
  }
  void layers_done(uint32_t from, uint32_t to) {
    for (uint32_t l = from; l < to; ++l)
      for (uint32_t rank = 0; rank < env_.tp(); ++rank)
        ASSERT_TRUE(env_.engine().push_layer_done(rank, current_step_, l,
                                                  Deadline::after(std::chrono::seconds(5))));
  }
  // Destination blocks outside every finished request still hold poison.
  uint64_t stray_writes(const std::vector<sim::RequestBlocks>& finished) {
    std::set<uint32_t> owned;
    for (const auto& r : finished)
      owned.insert(r.dst.begin(), r.dst.end());
    uint64_t stray = 0;
    for (uint32_t rank = 0; rank < env_.tp(); ++rank)
      for (uint32_t l = 0; l < layers_; ++l)
        for (uint32_t t = 0; t < 2; ++t)
          for (uint32_t b = next_dst_; b < env_.dst_pool(rank).geometry().num_blocks; ++b)
            if (owned.count(b) == 0 && !sim::block_is_poisoned(env_.dst_pool(rank), l, t, b))
              ++stray;
    return stray;
  }
  // Sends fresh requests until one finishes (the peer may still be coming
  // back: each attempt gets one completion); returns whether one did.
  bool a_new_request_goes_through(const std::string& prefix) {
    for (int attempt = 0; attempt < 20; ++attempt) {
      const std::string id = prefix + std::to_string(attempt);
      sim::RequestBlocks r = blocks(2);
      submit(id, r, 1);
      layers_done(0, layers_);
      const Completion c = env_.wait_for(id, std::chrono::seconds(20));
      if (c.status == CompletionStatus::kFinished) return env_.wrong_words(r) == 0;
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    return false;
  }

 private:
  TwoInstances& env_;
  uint32_t layers_;
  uint32_t block_tokens_;
  uint64_t next_tag_ = 0;
  uint32_t next_src_ = 0, next_dst_ = 0;
  uint64_t step_ = 0, current_step_ = 0;
};

}  // namespace kvrelay::testing

// Host pools for transport tests: every byte of (layer, tensor, block) gets
// a value of its own, so that a destination can be checked byte for byte
// for what a transfer should have put there and for what it must not touch.
#pragma once

#include <capnp/message.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "instance/pool_segment.h"
#include "worker/copy_plan.h"
#include "worker/local_pool.h"
#include "worker/transport.h"

namespace kvrelay::testing {

inline PoolGeometry transport_geometry(uint32_t head_dim = 64) {
  PoolGeometry g;
  g.num_layers = 3;
  g.num_blocks = 32;
  g.kv_heads = 2;
  g.block_size = 16;
  g.head_dim = head_dim;
  g.dtype = static_cast<uint32_t>(CacheDtype::kBf16);
  return g;
}

// A fresh pool named after the test process and `tag`; unlink it when done.
inline std::unique_ptr<worker::HostSegmentPool> make_test_pool(const std::string& prefix,
                                                               const std::string& tag,
                                                               const PoolGeometry& g) {
  const std::string name = fmt::format("kvrelay-{}-{}-{}", prefix, getpid(), tag);
  (void)SharedSegment::unlink(name);
  Result<HostPool> pool = HostPool::create(name, 0, PoolTier::kDevice, g);
  if (!pool) ADD_FAILURE() << pool.error().message;
  return std::make_unique<worker::HostSegmentPool>(std::move(pool).value());
}

inline std::byte pattern(uint32_t layer, uint32_t tensor, uint32_t block, uint64_t i) {
  return static_cast<std::byte>((layer * 131 + tensor * 31 + block * 7 + i) % 251 + 1);
}

inline void fill(const worker::LocalPool& pool) {
  const PoolGeometry& g = pool.geometry();
  for (uint32_t l = 0; l < g.total_layers(); ++l)
    for (uint32_t t = 0; t < g.tensors_per_layer(); ++t) {
      const auto tensor = static_cast<PoolTensor>(t);
      const uint64_t bb = g.block_bytes(tensor);
      for (uint32_t b = 0; b < g.blocks_in_layer(l); ++b)
        for (uint64_t i = 0; i < bb; ++i)
          pool.tensor(l, tensor)[b * bb + i] = pattern(l, t, b, i);
    }
}

// Bytes of the destination that differ from what src[k] -> dst[k] should have
// put there; every other block must still be zero.
inline uint64_t wrong_bytes(const worker::LocalPool& dst, const std::vector<uint32_t>& src_ids,
                            const std::vector<uint32_t>& dst_ids) {
  const PoolGeometry& g = dst.geometry();
  uint64_t wrong = 0;
  for (uint32_t l = 0; l < g.total_layers(); ++l)
    for (uint32_t t = 0; t < g.tensors_per_layer(); ++t) {
      const auto tensor = static_cast<PoolTensor>(t);
      const uint64_t bb = g.block_bytes(tensor);
      for (uint32_t b = 0; b < g.blocks_in_layer(l); ++b) {
        const auto k = std::find(dst_ids.begin(), dst_ids.end(), b);
        for (uint64_t i = 0; i < bb; ++i) {
          const std::byte want =
              k == dst_ids.end()
                  ? std::byte{0}
                  : pattern(l, t, src_ids[static_cast<size_t>(k - dst_ids.begin())], i);
          if (dst.tensor(l, tensor)[b * bb + i] != want) ++wrong;
        }
      }
    }
  return wrong;
}

// The completions `transport` reports within `within`, until there are `n`.
inline std::vector<worker::TransferCompletion> wait_for_completions(
    worker::Transport& transport, size_t n,
    std::chrono::milliseconds within = std::chrono::seconds(5)) {
  std::vector<worker::TransferCompletion> got;
  const auto until = std::chrono::steady_clock::now() + within;
  while (got.size() < n && std::chrono::steady_clock::now() < until) {
    transport.poll(got);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return got;
}

// Submits every layer of src_ids -> dst_ids (pools of `pool_blocks` blocks)
// as request `handle` (request key `request`), and returns the completions,
// one per layer, or fewer if they do not come within 5 s.
inline std::vector<worker::TransferCompletion> send_all_layers(
    worker::Transport& transport, worker::Destination& dest, uint32_t layers, uint64_t handle,
    const std::vector<uint32_t>& src_ids, const std::vector<uint32_t>& dst_ids,
    uint64_t request = 0, uint32_t pool_blocks = 32) {
  Result<std::vector<worker::BlockRun>> runs =
      worker::plan_block_runs(src_ids, dst_ids, pool_blocks, pool_blocks, 0, 0);
  EXPECT_TRUE(runs);
  for (uint32_t l = 0; l < layers; ++l) {
    worker::TransferTicket t;
    t.handle = handle;
    t.request_key = request;
    t.layer = l;
    EXPECT_TRUE(dest.submit_layer(t, l, *runs));
  }
  return wait_for_completions(transport, layers * dest.transfers_per_submit());
}

// The tcp destination of decode instance "d" on loopback, one port per
// decode rank (several: heterogeneous TP), as `sender` resolves it.
inline std::shared_ptr<worker::Destination> loopback_tcp_destination(
    worker::Transport& sender, const std::vector<uint16_t>& ports) {
  capnp::MallocMessageBuilder m;
  auto d = m.initRoot<schema::CacheDest>();
  d.setProtocol(schema::TransferProtocol::TCP);
  d.setPeerAddress("127.0.0.1");
  d.setPeerInstance("d");
  auto list = d.initTcpPorts(static_cast<unsigned>(ports.size()));
  for (size_t r = 0; r < ports.size(); ++r)
    list.set(static_cast<unsigned>(r), ports[r]);
  Result<std::shared_ptr<worker::Destination>> dest = sender.resolve(d.asReader());
  EXPECT_TRUE(dest) << dest.error().message;
  return dest ? *dest : nullptr;
}

// Heterogeneous TP: bytes of heads [dst_head, +heads) of each dst_ids[k]
// block of `dst` that differ from heads [src_head, +heads) of src_ids[k] in
// `src` (filled by fill()), over every layer and tensor.
inline uint64_t wrong_head_bytes(const worker::LocalPool& src, uint32_t src_head,
                                 const worker::LocalPool& dst, uint32_t dst_head, uint32_t heads,
                                 const std::vector<uint32_t>& src_ids,
                                 const std::vector<uint32_t>& dst_ids) {
  const PoolGeometry& sg = src.geometry();
  const PoolGeometry& dg = dst.geometry();
  uint64_t wrong = 0;
  for (uint32_t l = 0; l < dg.total_layers(); ++l)
    for (uint32_t t = 0; t < dg.tensors_per_layer(); ++t) {
      const auto tensor = static_cast<PoolTensor>(t);
      const uint64_t head = sg.block_bytes(tensor) / sg.kv_heads;
      for (size_t k = 0; k < dst_ids.size(); ++k)
        for (uint64_t i = 0; i < heads * head; ++i) {
          const uint64_t at = src_head * head + i;
          wrong += dst.tensor(l, tensor)[dst_ids[k] * dg.block_bytes(tensor) + dst_head * head + i] !=
                           pattern(l, t, src_ids[k], at)
                       ? 1
                       : 0;
        }
    }
  return wrong;
}

}  // namespace kvrelay::testing

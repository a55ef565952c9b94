// Valid example messages for tests, which each test then breaks in one way.
#pragma once

#include <capnp/message.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "schemas/kvrelay.capnp.h"
#include "schemas/validate.h"

namespace kvrelay::testing {

// tp=2, 32 layers, 512 blocks of 64 tokens, 1024 host blocks.
inline messages::Limits example_limits() {
  messages::Limits l;
  l.tp_size = 2;
  l.pool.num_layers = 32;
  l.pool.num_blocks = 512;
  l.host_blocks = 1024;
  l.pool.block_size = 64;
  l.pool.kv_heads = 1;
  l.pool.head_dim = 128;
  return l;
}

template <class T>
void set_list(T builder_list, std::initializer_list<uint32_t> values) {
  uint32_t i = 0;
  for (uint32_t v : values)
    builder_list.set(i++, v);
}

inline void fill_cache_task(schema::CacheTask::Builder t, const std::string& id,
                            std::vector<uint32_t> src, uint64_t tokens, uint32_t slot) {
  t.setRequestId(id);
  auto list = t.initSrcBlockIds(static_cast<unsigned>(src.size()));
  for (unsigned i = 0; i < src.size(); ++i)
    list.set(i, src[i]);
  t.setNeedPrefillTokens(tokens);
  t.setEngineSlot(slot);
}

inline void fill_cache_dest_ipc(schema::CacheDest::Builder d, const std::string& id,
                                std::vector<uint32_t> dest) {
  d.setRequestId(id);
  auto list = d.initDestBlockIds(static_cast<unsigned>(dest.size()));
  for (unsigned i = 0; i < dest.size(); ++i)
    list.set(i, dest[i]);
  d.setProtocol(schema::TransferProtocol::IPC);
  d.setPeerInstance("decode0");
  auto devices = d.initDeviceIds(2);
  devices.set(0, 0);
  devices.set(1, 1);
}

}  // namespace kvrelay::testing

// The C ABI (include/kvrelay.h), a thin layer over kvrelay::Client.
#include <cstring>
#include <memory>
#include <string>

#include "kvrelay.h"
#include "kvrelay/client.h"

struct kvrelay_client {
  kvrelay::Client client;
};

struct kvrelay_pool {
  std::unique_ptr<kvrelay::PoolView> pool;
};

namespace {

using namespace kvrelay;

thread_local std::string t_last_error;

kvrelay_status to_status(Errc code) {
  switch (code) {
    case Errc::kOk: return KVRELAY_OK;
    case Errc::kInvalidArgument:
    case Errc::kTooLarge: return KVRELAY_INVALID_ARGUMENT;
    case Errc::kFull: return KVRELAY_FULL;
    case Errc::kTimeout: return KVRELAY_TIMEOUT;
    case Errc::kCoordinatorGone:
    case Errc::kStale: return KVRELAY_COORDINATOR_GONE;
    case Errc::kNotFound: return KVRELAY_NOT_FOUND;
    case Errc::kAborted: return KVRELAY_ABORTED;
    case Errc::kPermissionDenied: return KVRELAY_PERMISSION_DENIED;
    case Errc::kBusy: return KVRELAY_BUSY;
    case Errc::kUnsupported: return KVRELAY_UNSUPPORTED;
    default: return KVRELAY_ERROR;
  }
}

kvrelay_status fail(kvrelay_status s, std::string message) {
  t_last_error = std::move(message);
  return s;
}

kvrelay_status from(const Status& s) {
  return s ? KVRELAY_OK : fail(to_status(s.code()), s.error().message);
}

// A timeout in ms as a deadline; negative timeouts are refused.
bool deadline_of(int64_t timeout_ms, Deadline* out) {
  if (timeout_ms < 0) return false;
  *out = Deadline::after(std::chrono::milliseconds(timeout_ms));
  return true;
}

#define KVRELAY_DEADLINE(var, ms)       \
  Deadline var = Deadline::now();       \
  if (!deadline_of(ms, &var))           \
  return fail(KVRELAY_INVALID_ARGUMENT, \
              "timeout_ms must not be negative: nothing in kvrelay waits forever")

#define KVRELAY_NEED(ptr) \
  if ((ptr) == nullptr) return fail(KVRELAY_INVALID_ARGUMENT, #ptr " must not be NULL")

std::string str(const char* s) {
  return s == nullptr ? std::string() : std::string(s);
}

template <class T>
std::vector<T> vec(const T* p, size_t n) {
  return p == nullptr ? std::vector<T>() : std::vector<T>(p, p + n);
}

void copy_completion(const Completion& c, kvrelay_completion* out) {
  std::memset(out, 0, sizeof(*out));
  std::strncpy(out->request_id, c.request_id.c_str(), sizeof(out->request_id) - 1);
  out->kind = static_cast<int32_t>(c.kind);
  out->status = static_cast<int32_t>(c.status);
  out->error_rank = c.error_rank;
  std::strncpy(out->message, c.message.c_str(), sizeof(out->message) - 1);
  out->bytes_moved = c.bytes_moved;
  out->submitted_ns = c.submitted_ns;
  out->completed_ns = c.completed_ns;
  out->first_copy_ns = c.first_copy_ns;
  out->blocks_reusable = c.blocks_reusable ? 1 : 0;
}

}  // namespace

extern "C" {

const char* kvrelay_last_error(void) {
  return t_last_error.c_str();
}

const char* kvrelay_status_name(kvrelay_status status) {
  switch (status) {
    case KVRELAY_OK: return "ok";
    case KVRELAY_INVALID_ARGUMENT: return "invalid argument";
    case KVRELAY_FULL: return "ring full";
    case KVRELAY_TIMEOUT: return "timeout";
    case KVRELAY_COORDINATOR_GONE: return "coordinator gone";
    case KVRELAY_NOT_FOUND: return "not found";
    case KVRELAY_ABORTED: return "aborted";
    case KVRELAY_PERMISSION_DENIED: return "permission denied";
    case KVRELAY_ERROR: return "error";
    case KVRELAY_BUSY: return "busy";
    case KVRELAY_UNSUPPORTED: return "unsupported";
  }
  return "unknown";
}

kvrelay_status kvrelay_attach(const char* instance, int64_t timeout_ms, kvrelay_client** out) {
  KVRELAY_NEED(instance);
  KVRELAY_NEED(out);
  KVRELAY_DEADLINE(deadline, timeout_ms);
  Result<Client> c = Client::attach(instance, deadline);
  if (!c) return fail(to_status(c.code()), c.error().message);
  *out = new kvrelay_client{std::move(c).value()};
  return KVRELAY_OK;
}

void kvrelay_detach(kvrelay_client* client) {
  delete client;
}

int kvrelay_rank_ready(const kvrelay_client* client, uint32_t rank) {
  return client != nullptr && client->client.rank_ready(rank) ? 1 : 0;
}

uint32_t kvrelay_tp_size(const kvrelay_client* client) {
  return client == nullptr ? 0 : client->client.info().tp_size;
}

uint32_t kvrelay_request_tag(const char* request_id) {
  return Client::request_tag(str(request_id));
}

kvrelay_status kvrelay_submit_cache_task(kvrelay_client* client, const char* request_id,
                                         const uint32_t* src_block_ids, size_t n_src,
                                         uint64_t need_prefill_tokens, int64_t engine_slot,
                                         uint64_t legacy_prefill_step, uint32_t deadline_ms,
                                         int64_t timeout_ms) {
  KVRELAY_NEED(client);
  KVRELAY_NEED(request_id);
  KVRELAY_DEADLINE(deadline, timeout_ms);
  CacheTaskSpec t;
  t.request_id = request_id;
  t.src_block_ids = vec(src_block_ids, n_src);
  t.need_prefill_tokens = need_prefill_tokens;
  if (engine_slot >= 0) {
    t.engine_slot = static_cast<uint32_t>(engine_slot);
  } else {
    t.legacy_prefill_step = legacy_prefill_step;
  }
  t.deadline_ms = deadline_ms;
  return from(client->client.submit(t, deadline));
}

kvrelay_status kvrelay_submit_cache_dest(kvrelay_client* client, const char* request_id,
                                         const uint32_t* dest_block_ids, size_t n_dest,
                                         kvrelay_protocol protocol, const char* peer_instance,
                                         const char* peer_address, const uint16_t* ports,
                                         size_t n_ports, const uint32_t* device_ids,
                                         size_t n_devices, const char* error_message,
                                         int64_t timeout_ms) {
  return kvrelay_submit_cache_dest_nonce(client, request_id, dest_block_ids, n_dest, protocol,
                                         peer_instance, peer_address, ports, n_ports, device_ids,
                                         n_devices, error_message, 0, timeout_ms);
}

kvrelay_status kvrelay_submit_cache_dest_nonce(kvrelay_client* client, const char* request_id,
                                               const uint32_t* dest_block_ids, size_t n_dest,
                                               kvrelay_protocol protocol, const char* peer_instance,
                                               const char* peer_address, const uint16_t* ports,
                                               size_t n_ports, const uint32_t* device_ids,
                                               size_t n_devices, const char* error_message,
                                               uint64_t request_nonce, int64_t timeout_ms) {
  KVRELAY_NEED(client);
  KVRELAY_NEED(request_id);
  KVRELAY_DEADLINE(deadline, timeout_ms);
  CacheDestSpec d;
  d.request_id = request_id;
  d.dest_block_ids = vec(dest_block_ids, n_dest);
  d.protocol = static_cast<Protocol>(protocol);
  d.peer_instance = str(peer_instance);
  d.peer_address = str(peer_address);
  (protocol == KVRELAY_TCP ? d.tcp_ports : d.rdma_ports) = vec(ports, n_ports);
  d.device_ids = vec(device_ids, n_devices);
  d.error_message = str(error_message);
  d.request_nonce = request_nonce;
  return from(client->client.submit(d, deadline));
}

kvrelay_status kvrelay_submit_swap(kvrelay_client* client, const char* request_id, int load,
                                   const uint32_t* device_block_ids, const uint32_t* host_block_ids,
                                   size_t n_blocks, uint32_t first_layer, uint32_t layer_count,
                                   uint32_t deadline_ms, int64_t timeout_ms) {
  KVRELAY_NEED(client);
  KVRELAY_NEED(request_id);
  KVRELAY_DEADLINE(deadline, timeout_ms);
  SwapSpec s;
  s.request_id = request_id;
  s.load = load != 0;
  s.device_block_ids = vec(device_block_ids, n_blocks);
  s.host_block_ids = vec(host_block_ids, n_blocks);
  s.first_layer = first_layer;
  s.layer_count = layer_count;
  s.deadline_ms = deadline_ms;
  return from(client->client.submit(s, deadline));
}

kvrelay_status kvrelay_expect_arrival(kvrelay_client* client, const char* request_id,
                                      const uint32_t* dest_block_ids, size_t n_dest,
                                      uint32_t deadline_ms, int64_t timeout_ms) {
  return kvrelay_expect_arrival_from(client, request_id, dest_block_ids, n_dest, deadline_ms,
                                     nullptr, 0, timeout_ms);
}

kvrelay_status kvrelay_expect_arrival_from(kvrelay_client* client, const char* request_id,
                                           const uint32_t* dest_block_ids, size_t n_dest,
                                           uint32_t deadline_ms, const char* from_instance,
                                           uint64_t request_nonce, int64_t timeout_ms) {
  KVRELAY_NEED(client);
  KVRELAY_NEED(request_id);
  KVRELAY_DEADLINE(deadline, timeout_ms);
  ExpectSpec e;
  e.request_id = request_id;
  e.dest_block_ids = vec(dest_block_ids, n_dest);
  e.deadline_ms = deadline_ms;
  e.from_instance = str(from_instance);
  e.request_nonce = request_nonce;
  return from(client->client.submit(e, deadline));
}

uint64_t kvrelay_random_nonce(void) {
  return Client::random_nonce();
}

kvrelay_status kvrelay_connect(kvrelay_client* client, uint64_t task_id, kvrelay_protocol protocol,
                               const char* peer_instance, const char* peer_address,
                               const uint16_t* ports, size_t n_ports, int64_t timeout_ms) {
  KVRELAY_NEED(client);
  KVRELAY_DEADLINE(deadline, timeout_ms);
  ConnectSpec c;
  c.task_id = task_id;
  c.protocol = static_cast<Protocol>(protocol);
  c.peer_instance = str(peer_instance);
  c.peer_address = str(peer_address);
  c.ports = vec(ports, n_ports);
  return from(client->client.submit(c, deadline));
}

kvrelay_status kvrelay_cancel(kvrelay_client* client, const char* request_id, int64_t timeout_ms) {
  KVRELAY_NEED(client);
  KVRELAY_NEED(request_id);
  KVRELAY_DEADLINE(deadline, timeout_ms);
  return from(client->client.cancel(request_id, deadline));
}

kvrelay_status kvrelay_register_pool(kvrelay_client* client, uint32_t rank, int host_tier,
                                     const char* segment_name, int64_t timeout_ms) {
  KVRELAY_NEED(client);
  KVRELAY_NEED(segment_name);
  KVRELAY_DEADLINE(deadline, timeout_ms);
  PoolSpec spec;
  spec.rank = rank;
  spec.tier = host_tier != 0 ? PoolTier::kHost : PoolTier::kDevice;
  spec.segment_name = segment_name;
  return from(client->client.register_pool(spec, deadline));
}

kvrelay_status kvrelay_register_host_fd_pool(kvrelay_client* client, uint32_t rank, int host_tier,
                                             const kvrelay_pool_memory* memories,
                                             size_t n_memories,
                                             const kvrelay_tensor_placement* tensors,
                                             size_t n_tensors, int64_t timeout_ms) {
  KVRELAY_NEED(client);
  if (memories == nullptr && n_memories != 0)
    return fail(KVRELAY_INVALID_ARGUMENT, "memories must not be NULL");
  if (tensors == nullptr && n_tensors != 0)
    return fail(KVRELAY_INVALID_ARGUMENT, "tensors must not be NULL");
  KVRELAY_DEADLINE(deadline, timeout_ms);
  PoolSpec spec;
  spec.rank = rank;
  spec.tier = host_tier != 0 ? PoolTier::kHost : PoolTier::kDevice;
  spec.location = PoolLocation::kHostFd;
  for (size_t m = 0; m < n_memories; ++m) {
    if (memories[m].reserved != 0)
      return fail(KVRELAY_INVALID_ARGUMENT,
                  "memories[" + std::to_string(m) + "].reserved must be 0");
    PoolMemorySpec memory;
    memory.fd = memories[m].fd;
    memory.bytes = memories[m].bytes;
    spec.memories.push_back(memory);
  }
  for (size_t t = 0; t < n_tensors; ++t) {
    if (tensors[t].reserved != 0)
      return fail(KVRELAY_INVALID_ARGUMENT,
                  "tensors[" + std::to_string(t) + "].reserved must be 0");
    spec.tensors.push_back(TensorPlacement{tensors[t].memory, tensors[t].offset});
  }
  return from(client->client.register_pool(spec, deadline));
}

kvrelay_status kvrelay_register_cuda_pool(kvrelay_client* client, uint32_t rank, int host_tier,
                                          const uint64_t* tensor_addresses, size_t n_tensors,
                                          int64_t timeout_ms) {
  KVRELAY_NEED(client);
  KVRELAY_NEED(tensor_addresses);
  KVRELAY_DEADLINE(deadline, timeout_ms);
  return from(client->client.register_cuda_pool(
      rank, host_tier != 0 ? PoolTier::kHost : PoolTier::kDevice,
      std::span<const uint64_t>(tensor_addresses, n_tensors), deadline));
}

kvrelay_status kvrelay_own_device_signals(kvrelay_client* client, uint32_t rank) {
  KVRELAY_NEED(client);
  return from(client->client.own_device_signals(rank));
}

kvrelay_status kvrelay_push_device_step(kvrelay_client* client, uint32_t rank, uint64_t step,
                                        const kvrelay_batch_slot* slots, size_t n_slots,
                                        uint32_t layers, void* stream, int64_t timeout_ms) {
  KVRELAY_NEED(client);
  if (slots == nullptr && n_slots != 0)
    return fail(KVRELAY_INVALID_ARGUMENT, "slots must not be NULL");
  KVRELAY_DEADLINE(deadline, timeout_ms);
  return from(client->client.push_device_step(
      rank, step, std::span<const BatchSlot>(reinterpret_cast<const BatchSlot*>(slots), n_slots),
      layers, stream, deadline));
}

kvrelay_status kvrelay_signal_layer(kvrelay_client* client, uint32_t rank, uint32_t layer,
                                    void* stream) {
  KVRELAY_NEED(client);
  return from(client->client.signal_layer(rank, layer, stream));
}

kvrelay_status kvrelay_own_completions(kvrelay_client* client) {
  KVRELAY_NEED(client);
  return from(client->client.own_completions());
}

kvrelay_status kvrelay_own_signals(kvrelay_client* client, uint32_t rank) {
  KVRELAY_NEED(client);
  return from(client->client.own_signals(rank));
}

kvrelay_status kvrelay_push_batch(kvrelay_client* client, uint32_t rank, uint64_t step,
                                  const kvrelay_batch_slot* slots, size_t n_slots,
                                  int64_t timeout_ms) {
  KVRELAY_NEED(client);
  if (slots == nullptr && n_slots != 0)
    return fail(KVRELAY_INVALID_ARGUMENT, "slots must not be NULL");
  KVRELAY_DEADLINE(deadline, timeout_ms);
  static_assert(sizeof(kvrelay_batch_slot) == sizeof(BatchSlot));
  return from(client->client.push_batch(
      rank, step, std::span<const BatchSlot>(reinterpret_cast<const BatchSlot*>(slots), n_slots),
      deadline));
}

kvrelay_status kvrelay_push_layer_done(kvrelay_client* client, uint32_t rank, uint64_t step,
                                       uint32_t layer, int64_t timeout_ms) {
  KVRELAY_NEED(client);
  KVRELAY_DEADLINE(deadline, timeout_ms);
  return from(client->client.push_layer_done(rank, step, layer, deadline));
}

kvrelay_status kvrelay_push_legacy_layer_done(kvrelay_client* client, uint32_t rank, uint64_t step,
                                              uint32_t layer, int64_t timeout_ms) {
  KVRELAY_NEED(client);
  KVRELAY_DEADLINE(deadline, timeout_ms);
  return from(client->client.push_legacy_layer_done(rank, step, layer, deadline));
}

kvrelay_status kvrelay_poll(kvrelay_client* client, kvrelay_completion* out, int* has) {
  KVRELAY_NEED(client);
  KVRELAY_NEED(out);
  KVRELAY_NEED(has);
  *has = 0;
  Result<std::optional<Completion>> c = client->client.poll();
  if (!c) return fail(to_status(c.code()), c.error().message);
  if (c->has_value()) {
    copy_completion(**c, out);
    *has = 1;
  }
  return KVRELAY_OK;
}

kvrelay_status kvrelay_wait(kvrelay_client* client, int64_t timeout_ms, kvrelay_completion* out) {
  KVRELAY_NEED(client);
  KVRELAY_NEED(out);
  KVRELAY_DEADLINE(deadline, timeout_ms);
  Result<Completion> c = client->client.wait(deadline);
  if (!c) return fail(to_status(c.code()), c.error().message);
  copy_completion(*c, out);
  return KVRELAY_OK;
}

kvrelay_status kvrelay_wait_layer(kvrelay_client* client, const char* request_id, uint32_t layer,
                                  int32_t rank, int64_t timeout_ms) {
  KVRELAY_NEED(client);
  KVRELAY_NEED(request_id);
  KVRELAY_DEADLINE(deadline, timeout_ms);
  std::optional<uint32_t> r;
  if (rank >= 0) r = static_cast<uint32_t>(rank);
  return from(client->client.wait_layer(request_id, layer, deadline, r));
}

kvrelay_status kvrelay_stream_wait_layer(kvrelay_client* client, const char* request_id,
                                         uint32_t layer, int32_t rank, void* stream,
                                         int64_t timeout_ms) {
  KVRELAY_NEED(client);
  KVRELAY_NEED(request_id);
  KVRELAY_DEADLINE(deadline, timeout_ms);
  std::optional<uint32_t> r;
  if (rank >= 0) r = static_cast<uint32_t>(rank);
  return from(client->client.stream_wait_layer(request_id, layer, stream, deadline, r));
}

kvrelay_status kvrelay_open_pool(const kvrelay_client* client, uint32_t rank, int host_tier,
                                 kvrelay_pool** out) {
  KVRELAY_NEED(client);
  KVRELAY_NEED(out);
  Result<PoolView> p =
      client->client.open_pool(rank, host_tier != 0 ? PoolTier::kHost : PoolTier::kDevice);
  if (!p) return fail(to_status(p.code()), p.error().message);
  *out = new kvrelay_pool{std::make_unique<PoolView>(std::move(p).value())};
  return KVRELAY_OK;
}

void kvrelay_close_pool(kvrelay_pool* pool) {
  delete pool;
}

void kvrelay_pool_get_geometry(const kvrelay_pool* pool, kvrelay_pool_geometry* out) {
  if (pool == nullptr || out == nullptr) return;
  const PoolGeometry& g = pool->pool->geometry();
  *out = kvrelay_pool_geometry{g.num_layers,         g.extra_layers, g.num_blocks,
                               g.extra_layer_blocks, g.kv_heads,     g.block_size,
                               g.head_dim,           g.dtype,        g.tensors_per_layer()};
}

kvrelay_status kvrelay_pool_block(const kvrelay_pool* pool, uint32_t layer, kvrelay_tensor tensor,
                                  uint32_t block_id, void** data, size_t* bytes) {
  KVRELAY_NEED(pool);
  KVRELAY_NEED(data);
  KVRELAY_NEED(bytes);
  const PoolGeometry& g = pool->pool->geometry();
  const int ti = static_cast<int>(tensor);
  const auto t = static_cast<PoolTensor>(ti);
  std::byte* p =
      ti < 0 || !g.has_tensor_id(static_cast<uint32_t>(ti)) ? nullptr : pool->pool->block(layer, t, block_id);
  if (p == nullptr)
    return fail(KVRELAY_INVALID_ARGUMENT,
                "no block " + std::to_string(block_id) + " of tensor " + std::to_string(ti) +
                    " in layer " + std::to_string(layer) + ": the pool has " +
                    std::to_string(g.total_layers()) + " layers, " +
                    std::to_string(g.tensors_per_layer()) + " tensors per layer" +
                    (g.k_only != 0 ? " (K only: no V)" : "") + " and " +
                    std::to_string(g.blocks_in_layer(layer < g.total_layers() ? layer : 0)) +
                    " blocks per layer");
  *data = p;
  *bytes = g.block_bytes(t);
  return KVRELAY_OK;
}

}  // extern "C"

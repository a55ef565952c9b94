/* kvrelay's C ABI: the engine-side client for languages and contexts that
 * can only call C - notably CUDA host callbacks, where an engine pushes its
 * layer signals.
 *
 * Handles are opaque. Every call returns a kvrelay_status; on failure,
 * kvrelay_last_error() returns a message for this thread's last failed call
 * (valid until the next failing call on the same thread).
 *
 * Timeouts are in milliseconds: 0 means "try once", a negative value is not
 * allowed (nothing in kvrelay waits forever).
 *
 * Signal pushes (kvrelay_push_batch, kvrelay_push_layer_done,
 * kvrelay_push_legacy_layer_done) allocate no memory and take no lock: they
 * write a fixed record into the rank's shared-memory ring and make a system
 * call only when the rank's worker is parked (or, with a timeout, when the
 * ring is full). They are safe inside a CUDA host callback, and threads of
 * one process may push to one rank at once. The first push of a process to
 * a rank takes that rank's signal ring for the process (once: an allocation
 * and a lock); call kvrelay_own_signals() up front, outside the callback. A
 * second process pushing to the same rank gets KVRELAY_BUSY.
 *
 * Step numbers: each kvrelay_push_batch starts a new batch, whose layer
 * signals carry the same step. Steps should grow; a number used again starts
 * a new batch all the same (it never merges with an earlier one). Signals
 * with a request tag may come before or after the request's CacheTask;
 * untagged ones (tag 0) must come after it, and are then stamped with the
 * request their slot was last given (docs/engine-api.md, "Untagged signals").
 *
 * Contract (as for the C++ client, client/include/kvrelay/client.h): exactly
 * one completion per request; every attach is an engine session (if its
 * process dies, its requests are withdrawn and their completions dropped;
 * kvrelay_detach leaves them running); one completion reader per instance;
 * one signal-producing process per rank; any number of submitters. Every call
 * returns KVRELAY_COORDINATOR_GONE within 100 ms of the coordinator's death.
 */
#ifndef KVRELAY_H
#define KVRELAY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvrelay_client kvrelay_client;
typedef struct kvrelay_pool kvrelay_pool;

typedef enum kvrelay_status {
  KVRELAY_OK = 0,
  KVRELAY_INVALID_ARGUMENT = 1, /* bad input; nothing was submitted */
  KVRELAY_FULL = 2,             /* a ring stayed full until the timeout; nothing was written */
  KVRELAY_TIMEOUT = 3,          /* nothing arrived before the timeout */
  KVRELAY_COORDINATOR_GONE = 4, /* the instance's coordinator died or the instance shut down */
  KVRELAY_NOT_FOUND = 5,        /* no such instance */
  KVRELAY_ABORTED = 6,          /* the load being waited on failed or was cancelled */
  KVRELAY_PERMISSION_DENIED = 7,
  KVRELAY_ERROR = 8,       /* anything else; see kvrelay_last_error() */
  KVRELAY_BUSY = 9,        /* another live process holds it (e.g. rank r's signal ring) */
  KVRELAY_UNSUPPORTED = 10 /* this build or machine cannot do it (no CUDA, no GPU) */
} kvrelay_status;

typedef enum kvrelay_protocol {
  KVRELAY_IPC = 0,
  KVRELAY_TCP = 1,
  KVRELAY_RDMA = 2
} kvrelay_protocol;

typedef enum kvrelay_completion_status {
  KVRELAY_FINISHED = 0,
  KVRELAY_FAILED = 1, /* error: see error_rank and message */
  KVRELAY_CANCELLED = 2,
  KVRELAY_TIMED_OUT = 3,
  KVRELAY_REJECTED = 4 /* a refused submission; does not end the request of that id */
} kvrelay_completion_status;

typedef enum kvrelay_completion_kind {
  KVRELAY_KIND_CACHE = 0,
  KVRELAY_KIND_SWAP = 1,
  KVRELAY_KIND_CONNECT = 2,
  KVRELAY_KIND_REGISTER_POOL = 3,
  KVRELAY_KIND_OTHER = 4,
  KVRELAY_KIND_CANCEL = 5, /* the answer to a refused cancel (rejected) */
  KVRELAY_KIND_ARRIVED = 6 /* an expected request's KV arrived (decode side, tcp or ipc) */
} kvrelay_completion_kind;

typedef struct kvrelay_completion {
  char request_id[132]; /* NUL-terminated */
  int32_t kind;         /* kvrelay_completion_kind */
  int32_t status;       /* kvrelay_completion_status */
  int32_t error_rank;   /* -1 unless a rank failed */
  char message[512];    /* NUL-terminated, truncated if longer */
  uint64_t bytes_moved;
  uint64_t submitted_ns; /* CLOCK_MONOTONIC */
  uint64_t completed_ns;
  uint64_t first_copy_ns;  /* when the first rank began copying; 0: nothing copied */
  int32_t blocks_reusable; /* 1: no rank can still write into the destination blocks; 0: wait */
} kvrelay_completion;

typedef struct kvrelay_batch_slot {
  uint32_t slot;
  uint32_t chunk_token_offset;
  uint32_t chunk_len;
  uint32_t request_tag; /* kvrelay_request_tag(request id), or 0 */
} kvrelay_batch_slot;

/* The shape of one rank's KV pool (DESIGN.md section 6). */
typedef struct kvrelay_pool_geometry {
  uint32_t num_layers;
  uint32_t extra_layers;       /* speculative extra cache layers, after num_layers */
  uint32_t num_blocks;         /* blocks in each of the num_layers layers */
  uint32_t extra_layer_blocks; /* blocks in each extra layer */
  uint32_t kv_heads;
  uint32_t block_size; /* tokens per block */
  uint32_t head_dim;
  uint32_t dtype;             /* 0 bfloat16, 1 float16, 2 uint8, 3 fp8 */
  uint32_t tensors_per_layer; /* 2 (K, V) or 4 (K, V, K scale, V scale); in a K-only
                                 pool (an MLA latent cache, --k-only) 1 (K) or 2 (K,
                                 K scale) */
} kvrelay_pool_geometry;

/* Host memory an engine brings by file descriptor (kvrelay_register_host_fd_pool):
 * a memfd of `bytes` bytes, sealed with F_SEAL_SHRINK so it cannot shrink under
 * a worker that maps it. The caller keeps its fd; the library passes a duplicate. */
typedef struct kvrelay_pool_memory {
  int32_t fd;
  uint32_t reserved; /* 0 */
  uint64_t bytes;
} kvrelay_pool_memory;

/* Where one tensor lies: `offset` bytes into memories[memory], 16-byte aligned. */
typedef struct kvrelay_tensor_placement {
  uint32_t memory;
  uint32_t reserved; /* 0 */
  uint64_t offset;
} kvrelay_tensor_placement;

typedef enum kvrelay_tensor {
  KVRELAY_KEY = 0,
  KVRELAY_VALUE = 1,
  KVRELAY_KEY_SCALE = 2,
  KVRELAY_VALUE_SCALE = 3
} kvrelay_tensor;

/* The message of this thread's last failed call ("" if none). */
const char* kvrelay_last_error(void);
const char* kvrelay_status_name(kvrelay_status status);

/* Attaches to `instance`, waiting up to timeout_ms for it to be ready. */
kvrelay_status kvrelay_attach(const char* instance, int64_t timeout_ms, kvrelay_client** out);
void kvrelay_detach(kvrelay_client* client);
/* 1 when rank `rank` is serving (the original's cache_ready_signal), else 0. */
int kvrelay_rank_ready(const kvrelay_client* client, uint32_t rank);
uint32_t kvrelay_tp_size(const kvrelay_client* client);
uint32_t kvrelay_request_tag(const char* request_id);

/* The prefill half. engine_slot >= 0 for per-chunk mode; otherwise
 * legacy_prefill_step is used (legacy per-query mode). */
kvrelay_status kvrelay_submit_cache_task(kvrelay_client* client, const char* request_id,
                                         const uint32_t* src_block_ids, size_t n_src,
                                         uint64_t need_prefill_tokens, int64_t engine_slot,
                                         uint64_t legacy_prefill_step, uint32_t deadline_ms,
                                         int64_t timeout_ms);
/* The decode half. `ports` are rdma_ports (KVRELAY_RDMA) or tcp_ports
 * (KVRELAY_TCP); strings may be NULL. A non-empty error_message fails the
 * request with that text. */
kvrelay_status kvrelay_submit_cache_dest(kvrelay_client* client, const char* request_id,
                                         const uint32_t* dest_block_ids, size_t n_dest,
                                         kvrelay_protocol protocol, const char* peer_instance,
                                         const char* peer_address, const uint16_t* ports,
                                         size_t n_ports, const uint32_t* device_ids,
                                         size_t n_devices, const char* error_message,
                                         int64_t timeout_ms);
/* As kvrelay_submit_cache_dest, with the decode engine's request nonce. */
kvrelay_status kvrelay_submit_cache_dest_nonce(kvrelay_client* client, const char* request_id,
                                               const uint32_t* dest_block_ids, size_t n_dest,
                                               kvrelay_protocol protocol, const char* peer_instance,
                                               const char* peer_address, const uint16_t* ports,
                                               size_t n_ports, const uint32_t* device_ids,
                                               size_t n_devices, const char* error_message,
                                               uint64_t request_nonce, int64_t timeout_ms);
/* load = 0: evict (device -> host); load = 1: load (host -> device). */
kvrelay_status kvrelay_submit_swap(kvrelay_client* client, const char* request_id, int load,
                                   const uint32_t* device_block_ids, const uint32_t* host_block_ids,
                                   size_t n_blocks, uint32_t first_layer, uint32_t layer_count,
                                   uint32_t deadline_ms, int64_t timeout_ms);
/* Decode side (tcp or ipc): request_id's KV will arrive into dest_block_ids; its
 * completion (KVRELAY_KIND_ARRIVED) says when every byte is here. */
kvrelay_status kvrelay_expect_arrival(kvrelay_client* client, const char* request_id,
                                      const uint32_t* dest_block_ids, size_t n_dest,
                                      uint32_t deadline_ms, int64_t timeout_ms);
/* As kvrelay_expect_arrival, naming the sender and sharing a nonce:
 * from_instance (NULL or "": any peer holding the key) is the prefill
 * instance whose writes alone count; request_nonce (0: none) is a secret the
 * prefill engine passes to kvrelay_submit_cache_dest_nonce, without which a
 * peer cannot name the request. */
kvrelay_status kvrelay_expect_arrival_from(kvrelay_client* client, const char* request_id,
                                           const uint32_t* dest_block_ids, size_t n_dest,
                                           uint32_t deadline_ms, const char* from_instance,
                                           uint64_t request_nonce, int64_t timeout_ms);
/* A request nonce from the system's CSPRNG; never 0. */
uint64_t kvrelay_random_nonce(void);
kvrelay_status kvrelay_connect(kvrelay_client* client, uint64_t task_id, kvrelay_protocol protocol,
                               const char* peer_instance, const char* peer_address,
                               const uint16_t* ports, size_t n_ports, int64_t timeout_ms);
kvrelay_status kvrelay_cancel(kvrelay_client* client, const char* request_id, int64_t timeout_ms);
kvrelay_status kvrelay_register_pool(kvrelay_client* client, uint32_t rank, int host_tier,
                                     const char* segment_name, int64_t timeout_ms);
/* Host memory the engine allocated in memfds (see kvrelay_pool_memory): every
 * tensor's place in them, layer-major (K, V[, K scale, V scale] per layer, extra
 * layers included; in a K-only pool K[, K scale] per layer). The completion (KVRELAY_KIND_REGISTER_POOL) says whether
 * the worker mapped it, or why not. */
kvrelay_status kvrelay_register_host_fd_pool(kvrelay_client* client, uint32_t rank, int host_tier,
                                             const kvrelay_pool_memory* memories,
                                             size_t n_memories,
                                             const kvrelay_tensor_placement* tensors,
                                             size_t n_tensors, int64_t timeout_ms);
/* GPU memory by the device address of each of the pool's n_tensors tensors,
 * layer-major (K, V[, K scale, V scale] per layer; in a K-only pool, such as an
 * MLA latent cache, K[, K scale] per layer): the library shares each
 * allocation once (a legacy IPC handle for cudaMalloc memory, POSIX fds for
 * VMM memory). KVRELAY_UNSUPPORTED without CUDA or a GPU. */
kvrelay_status kvrelay_register_cuda_pool(kvrelay_client* client, uint32_t rank, int host_tier,
                                          const uint64_t* tensor_addresses, size_t n_tensors,
                                          int64_t timeout_ms);

/* Layer signals: no allocation, no lock (see the top). */
kvrelay_status kvrelay_own_signals(kvrelay_client* client, uint32_t rank);
kvrelay_status kvrelay_push_batch(kvrelay_client* client, uint32_t rank, uint64_t step,
                                  const kvrelay_batch_slot* slots, size_t n_slots,
                                  int64_t timeout_ms);
kvrelay_status kvrelay_push_layer_done(kvrelay_client* client, uint32_t rank, uint64_t step,
                                       uint32_t layer, int64_t timeout_ms);
kvrelay_status kvrelay_push_legacy_layer_done(kvrelay_client* client, uint32_t rank, uint64_t step,
                                              uint32_t layer, int64_t timeout_ms);

/* GPU-written layer signals (see kvrelay/client.h, "GPU-written layer
 * signals"): before each step, kvrelay_push_device_step (outside any CUDA
 * graph); after layer l's KV is written, kvrelay_signal_layer on the same
 * stream (capturable). `stream` is a cudaStream_t. */
kvrelay_status kvrelay_own_device_signals(kvrelay_client* client, uint32_t rank);
kvrelay_status kvrelay_push_device_step(kvrelay_client* client, uint32_t rank, uint64_t step,
                                        const kvrelay_batch_slot* slots, size_t n_slots,
                                        uint32_t layers, void* stream, int64_t timeout_ms);
kvrelay_status kvrelay_signal_layer(kvrelay_client* client, uint32_t rank, uint32_t layer,
                                    void* stream);

/* Completions: one reader per instance. The first client to poll or wait (or
 * to call kvrelay_own_completions) becomes it and receives every completion
 * of the instance; any other gets KVRELAY_BUSY, naming the reader, until the
 * reader is closed or its process exits. kvrelay_poll sets *has to 1 and
 * fills *out when one waits. */
kvrelay_status kvrelay_own_completions(kvrelay_client* client);
kvrelay_status kvrelay_poll(kvrelay_client* client, kvrelay_completion* out, int* has);
kvrelay_status kvrelay_wait(kvrelay_client* client, int64_t timeout_ms, kvrelay_completion* out);
/* Waits until layer `layer` of load `request_id` is back on every rank
 * (rank < 0) or on rank `rank`. */
kvrelay_status kvrelay_wait_layer(kvrelay_client* client, const char* request_id, uint32_t layer,
                                  int32_t rank, int64_t timeout_ms);
/* The same wait enqueued on a GPU stream (cuStreamWaitValue64): returns once
 * enqueued. A failed load releases the stream too: check its completion. */
kvrelay_status kvrelay_stream_wait_layer(kvrelay_client* client, const char* request_id,
                                         uint32_t layer, int32_t rank, void* stream,
                                         int64_t timeout_ms);

/* Host-memory pools (the host default's "device" memory, or the host tier
 * with host_tier = 1): map rank `rank`'s pool to read or write KV bytes. A
 * pool stays mapped until kvrelay_close_pool, also after kvrelay_detach. */
kvrelay_status kvrelay_open_pool(const kvrelay_client* client, uint32_t rank, int host_tier,
                                 kvrelay_pool** out);
void kvrelay_close_pool(kvrelay_pool* pool);
void kvrelay_pool_get_geometry(const kvrelay_pool* pool, kvrelay_pool_geometry* out);
/* One block of one tensor of one layer: *data and *bytes. INVALID_ARGUMENT
 * when the layer, tensor or block is out of range. */
kvrelay_status kvrelay_pool_block(const kvrelay_pool* pool, uint32_t layer, kvrelay_tensor tensor,
                                  uint32_t block_id, void** data, size_t* bytes);

#ifdef __cplusplus
}
#endif

#endif /* KVRELAY_H */

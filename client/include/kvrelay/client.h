// kvrelay's engine-side library (C++). An engine attaches to an instance,
// submits requests, pushes layer signals and reads completions, all through
// the instance's shared-memory rings.
//
// Contract:
//  - Exactly one completion per request: finished, error, cancelled or
//    timeout. A submission refused without affecting any live request (a
//    duplicate half, a cancel for an id that is not live, an undecodable
//    record) gets a `rejected` completion, which does not end the request of
//    that id.
//  - Every Client is an engine session. When the process that attached it
//    dies, the requests it submitted are withdrawn (their blocks confirmed
//    free) and nobody receives their completions; a Client that is destroyed
//    (detaches cleanly) leaves its requests running, and their completions
//    are delivered as usual. A restarted engine may reuse the request ids of
//    its dead predecessor as soon as its attach returns. The session is held
//    by a lock on an open file: a child forked (without exec) after attach
//    shares it, and the session ends only when both have exited.
//  - One completion reader per instance, enforced: the first Client to call
//    poll()/wait() (or own_completions()) becomes the reader and receives
//    every completion of the instance, whichever session submitted it; any
//    other Client, in this process or another, gets kBusy naming the
//    reader's pid and session, until the reader is destroyed or its process
//    exits (then the next one takes over, and finds every completion the
//    old reader had not read).
//  - One signal-producing process per rank: the layer signals of rank r
//    come from one process (the engine's rank-r model runner); any of its
//    threads may push, concurrently (a CUDA host callback thread and the
//    scheduler thread, say). A second process pushing to the same rank gets
//    kBusy. Pushing a signal allocates nothing, takes no lock and makes no
//    system call unless the worker is parked (or the first push of the
//    process, which takes the rank's signal ring: call own_signals() up front
//    to do that outside a callback), so it may run inside a CUDA host callback.
//  - Step numbers: each push_batch() starts a new batch; its layer records
//    (push_layer_done) carry the same step. Steps should grow from batch to
//    batch; a number used again starts a new batch all the same (it never
//    merges with an earlier batch).
//  - Signals carry request tags (BatchSlot::request_tag) when the engine
//    can: then they may be pushed before or after the request's CacheTask.
//    Untagged signals (tag 0, the original's protocol) must be pushed after
//    the request's CacheTask was submitted: an untagged entry is stamped, as
//    it is pushed, with the request its slot was last given by a CacheTask
//    of this instance (any process's), so it then reaches that request
//    exactly (docs/engine-api.md, "Untagged signals").
//  - Any number of processes may submit requests.
//  - No call waits forever: blocking calls take a Deadline. If the
//    coordinator dies, every call returns Errc::kCoordinatorGone within
//    100 ms instead of hanging or pretending to succeed; attach again once a
//    new coordinator is up.
//
// This header and the ones it includes (client/include/kvrelay/) are the
// whole of what an engine compiles against: the standard library only.
//
// Errors are values (kvrelay::Result / Status) with a message to show:
// kFull (ring full, nothing written), kCoordinatorGone, kInvalidArgument
// (bad input; nothing was submitted), kTimeout, kTooLarge, kBusy.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvrelay/deadline.h"
#include "kvrelay/instance_info.h"
#include "kvrelay/pool_view.h"
#include "kvrelay/result.h"
#include "kvrelay/types.h"

namespace kvrelay {

enum class Protocol : uint16_t { kIpc = 0, kTcp = 1, kRdma = 2 };

// The prefill half (the original's src_block_ids / current_id / need_prefill_tokens).
struct CacheTaskSpec {
  std::string request_id;
  std::vector<uint32_t> src_block_ids;
  uint64_t need_prefill_tokens = 0;
  std::optional<uint32_t> engine_slot;          // per-chunk mode
  std::optional<uint64_t> legacy_prefill_step;  // legacy per-query mode
  uint32_t deadline_ms = 0;                     // 0: the instance default
};

// The decode half (the original's dest_block_ids / transfer_protocol / ip /
// rdma_ports / device_ids / error_msg).
struct CacheDestSpec {
  std::string request_id;
  std::vector<uint32_t> dest_block_ids;
  Protocol protocol = Protocol::kIpc;
  std::string peer_instance;  // ipc: the decode instance on this host
  std::string peer_address;   // tcp/rdma
  std::vector<uint16_t> rdma_ports;
  std::vector<uint16_t> tcp_ports;
  std::vector<uint32_t> device_ids;
  std::string error_message;  // the decode side refused: fails the request
  // The secret the decode engine chose for this request (its ExpectSpec's
  // request_nonce), passed on with dest_block_ids. 0: none.
  uint64_t request_nonce = 0;
};

struct SwapSpec {
  std::string request_id;
  bool load = false;  // false: evict (device -> host); true: load (host -> device)
  std::vector<uint32_t> device_block_ids;
  std::vector<uint32_t> host_block_ids;
  uint32_t first_layer = 0;
  uint32_t layer_count = 0;  // 0: all layers
  uint32_t deadline_ms = 0;
};

// Submitted to a decode instance by its own engine: request `request_id`'s
// KV will arrive (over tcp or ipc) into `dest_block_ids` (its CacheDest's).
// Its completion, kind kArrived, says every byte is in every rank's pool, or
// why not (error naming the rank, timeout at its deadline). Until then the
// ranks accept that request's writes only into these blocks and nobody
// else's writes into them. Refused by an instance that is not a decode one.
//
// Name the sender and share a nonce: from_instance, the prefill instance
// that sends it (only its writes count), and request_nonce, a random
// number the prefill engine passes on in its CacheDestSpec (a peer that
// holds the network key but not the nonce cannot address the request).
// Client::random_nonce() makes one.
struct ExpectSpec {
  std::string request_id;
  std::vector<uint32_t> dest_block_ids;
  uint32_t deadline_ms = 0;
  std::string from_instance;   // empty: any peer that holds the key
  uint64_t request_nonce = 0;  // 0: none
};

struct ConnectSpec {
  uint64_t task_id = 0;  // the completion's id is "connect-<task_id>"
  Protocol protocol = Protocol::kIpc;
  std::string peer_instance;
  std::string peer_address;
  std::vector<uint16_t> ports;
};

// A slice of a kCudaVmm range that is its own allocation.
struct PoolChunkSpec {
  int fd = -1;  // this process's fd of the allocation; the library passes a duplicate
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

// One range of memory that holds some of the pool's tensors.
struct PoolMemorySpec {
  uint64_t bytes = 0;
  std::array<unsigned char, 64> cuda_ipc_handle{};  // kCudaIpc: cudaIpcGetMemHandle's bytes
  int fd = -1;                        // kCudaVmm (one allocation), kHostFd: this process's fd
  std::vector<PoolChunkSpec> chunks;  // kCudaVmm in several allocations, back to back
};

// Where one tensor lies: `offset` bytes into memories[memory].
struct TensorPlacement {
  uint32_t memory = 0;
  uint64_t offset = 0;
};

struct PoolSpec {
  uint32_t rank = 0;
  PoolTier tier = PoolTier::kDevice;
  std::string segment_name;  // kHostSegment: the segment (without '/')
  PoolLocation location = PoolLocation::kHostSegment;
  uint32_t device_id = 0;  // GPU locations: the GPU that holds the pool (this process's ordinal)
  // ...and its UUID (cudaDeviceProp::uuid), which names it in the worker's
  // process too, whatever CUDA_VISIBLE_DEVICES each has. All zero: unknown
  // (the worker then takes device_id as its own ordinal).
  std::array<uint8_t, 16> device_uuid{};
  // Other locations: the memory, and every tensor's place in it, layer-major
  // ([layer 0 K, layer 0 V, (K scale, V scale,) layer 1 K, ...], extra
  // layers included), each 16-byte aligned.
  std::vector<PoolMemorySpec> memories;
  std::vector<TensorPlacement> tensors;
};

enum class CompletionStatus : uint16_t { kFinished, kError, kCancelled, kTimeout, kRejected };
enum class CompletionKind : uint16_t {
  kCache,
  kSwap,
  kConnect,
  kRegisterPool,
  kOther,
  kCancel,
  kArrived,  // an ExpectSpec: the request's KV is here
};
const char* completion_status_name(CompletionStatus s);

struct Completion {
  std::string request_id;
  CompletionKind kind = CompletionKind::kOther;
  CompletionStatus status = CompletionStatus::kError;
  int32_t error_rank = -1;
  std::string message;
  uint64_t bytes_moved = 0;
  uint64_t submitted_ns = 0;  // CLOCK_MONOTONIC
  uint64_t completed_ns = 0;
  // When the first rank began copying for the request (0: nothing copied):
  // minus the engine's submit time, the dispatch latency.
  uint64_t first_copy_ns = 0;
  // True when no rank can still write into the request's destination
  // blocks: they may be reused at once. False only when a rank could not be
  // confirmed stopped (the message says which): wait before reusing them.
  bool blocks_reusable = true;
};

// One entry of a step's batch: slot `slot` prefilled tokens
// [chunk_token_offset, chunk_token_offset + chunk_len) in this step of the
// request whose tag is `request_tag` (Client::request_tag(request_id)).
// Pass the tag whenever the engine knows which request is in the slot: then
// signals that reach a worker before the request's CacheTask are attributed
// exactly, even if the slot is reused meanwhile. A tag of 0 falls back to
// "a chunk at offset 0 starts a new request".
struct BatchSlot {
  uint32_t slot;
  uint32_t chunk_token_offset;
  uint32_t chunk_len;
  uint32_t request_tag = 0;
};

class Client {
 public:
  // The 32-bit tag of a request id, for BatchSlot::request_tag. Never 0.
  static uint32_t request_tag(std::string_view request_id);
  // A request nonce (ExpectSpec::request_nonce) from the system's CSPRNG.
  // Never 0.
  static uint64_t random_nonce();

  // Attaches to `instance` and waits (until `ready_by`) for it to be ready;
  // an instance whose coordinator is still starting is waited for. An
  // instance whose coordinator is gone (a stale segment) is refused at once
  // with kCoordinatorGone. Returns once the coordinator has acknowledged the
  // session, which it does only after withdrawing the requests of engine
  // sessions that died.
  static Result<Client> attach(std::string_view instance, Deadline ready_by);

  Client(Client&&) noexcept;
  Client& operator=(Client&&) noexcept;
  ~Client();

  // The instance's ranks, role, pool shapes, protocols and time limits.
  const InstanceInfo& info() const;
  uint64_t epoch() const;
  // The original's cache_ready_signal: 1 when rank r is serving.
  bool rank_ready(uint32_t rank) const;

  // ---- submissions (any process; each waits for ring room until `deadline`) ----
  Status submit(const CacheTaskSpec& task, Deadline deadline);
  Status submit(const CacheDestSpec& dest, Deadline deadline);
  Status submit(const SwapSpec& swap, Deadline deadline);
  Status submit(const ExpectSpec& expect, Deadline deadline);
  Status submit(const ConnectSpec& connect, Deadline deadline);
  // Tells rank `pool.rank`'s worker to serve `pool` from now on (refused
  // while it has requests in flight). File descriptors travel to the worker
  // over its Unix socket first; the caller keeps its own. The completion
  // (kind kRegisterPool) says whether the worker mapped it.
  Status register_pool(const PoolSpec& pool, Deadline deadline);
  // The same for GPU memory, by the device address of each tensor
  // (layer-major, as PoolSpec::tensors): the library finds the allocations
  // that hold them and shares each once, by legacy IPC handle (cudaMalloc
  // memory) or by POSIX fds (VMM memory, e.g. PyTorch's expandable
  // segments; it must have been created exportable as fds). kUnsupported
  // without CUDA or a GPU.
  Status register_cuda_pool(uint32_t rank, PoolTier tier,
                            std::span<const uint64_t> tensor_addresses, Deadline deadline);
  Status cancel(std::string_view request_id, Deadline deadline);

  // ---- layer signals (one process per rank; see the contract above) ----
  // Takes rank `rank`'s signal ring for this process now, instead of at the
  // first push (which may be in a CUDA callback). kBusy when another process
  // pushes to it.
  Status own_signals(uint32_t rank);
  // A step's batch; split over several records when large. Call before the
  // step's first layer_done.
  Status push_batch(uint32_t rank, uint64_t step, std::span<const BatchSlot> slots,
                    Deadline deadline);
  // Layer `layer` of step `step` is computed for every slot of its batch.
  // Pushed from the host, so it orders nothing on the GPU: call it only once
  // the layer's KV is written (its stream synchronized, or from a host
  // callback on that stream), or the worker may copy the layer before the
  // kernels that write it ran. An engine that cannot wait on the host uses
  // the GPU-written signals below, which the stream itself orders.
  Status push_layer_done(uint32_t rank, uint64_t step, uint32_t layer, Deadline deadline);
  // Legacy per-query mode: (step, layer) is the newest computed position.
  Status push_legacy_layer_done(uint32_t rank, uint64_t step, uint32_t layer, Deadline deadline);

  // ---- GPU-written layer signals ----
  // For an engine whose forward pass runs in CUDA graphs (no host callback
  // per layer): its stream signals each layer itself. Per step, on rank r's
  // model runner:
  //   push_device_step(r, step, batch, layers, stream)  before launching the
  //       step (outside any graph): pushes the batch, announces that the
  //       stream signals its `layers` layers, and writes the step's base
  //       count on `stream`
  //   signal_layer(r, l, stream)  after layer l's KV is written, on the
  //       stream that wrote it: one tiny kernel; capturable in a graph
  // A graph captured once replays correctly: what a replay signals depends
  // on the base written before it. A replay without push_device_step
  // repeats the old counts, so the worker waits rather than send early. The
  // stream is a cudaStream_t; the current CUDA device must be the stream's.
  // kUnsupported without CUDA or a GPU.
  //
  // A graph captured with signal_layer belongs to this Client: capture it
  // again with a new Client, since replaying it after this one is destroyed
  // writes through memory that is no longer the client's. Destroying the
  // Client waits up to 2 s for the work it enqueued outside graphs (here
  // and in stream_wait_layer) to finish, through CUDA events of its own: the
  // engine may destroy its streams before or after the Client. If that work
  // has not finished, the device side (a pinned page, 8 bytes of GPU
  // memory, the instance's mapping) is kept for the process's life rather
  // than freed under the stream. Graph replays are not waited for: let them
  // finish (their completions say so) before destroying the Client.
  //
  // Takes rank `rank`'s signal ring and pins its device signal word for the
  // current CUDA device (done by the first push_device_step otherwise).
  Status own_device_signals(uint32_t rank);
  Status push_device_step(uint32_t rank, uint64_t step, std::span<const BatchSlot> slots,
                          uint32_t layers, void* stream, Deadline deadline);
  Status signal_layer(uint32_t rank, uint32_t layer, void* stream);

  // ---- swap loads ----
  // Waits until layer `layer` of the load `request_id` is back in the device
  // tier on every rank (or on `rank` only), so that the forward pass can use
  // it while later layers are still loading. Parks on a futex (no spinning
  // beyond a few microseconds); any process of the engine may call it.
  // kAborted when the load failed or was cancelled before that layer;
  // kInvalidArgument when the load does not cover the layer; kTimeout at the
  // deadline (also when no such load was submitted); kCoordinatorGone.
  Status wait_layer(std::string_view request_id, uint32_t layer, Deadline deadline,
                    std::optional<uint32_t> rank = std::nullopt);

  // The same wait on a GPU stream (a cudaStream_t), with no host thread:
  // enqueues cuStreamWaitValue64 so that the stream's later work runs once
  // layer `layer` of the load is on the device on every rank (or `rank`).
  // Returns once the wait is enqueued (the load must have been dispatched
  // by then: waits for that until `deadline`). If the load fails, the
  // stream is released all the same: check the load's completion before
  // trusting its data. kUnsupported without CUDA or a GPU.
  Status stream_wait_layer(std::string_view request_id, uint32_t layer, void* stream,
                           Deadline deadline, std::optional<uint32_t> rank = std::nullopt);

  // ---- completions (one reader per instance) ----
  // Becomes the instance's completion reader now (the first poll or wait
  // does otherwise). kBusy, naming the reader, when another Client is it.
  Status own_completions();
  // The next completion if one is waiting. Thread-safe (the reads are
  // serialised).
  Result<std::optional<Completion>> poll();
  // Waits for the next completion until `deadline` (kTimeout), or until the
  // coordinator is found dead (kCoordinatorGone).
  Result<Completion> wait(Deadline deadline);

  // Ok while the coordinator lives; kCoordinatorGone otherwise.
  Status coordinator_alive() const;
  // This attachment's engine session id (what completions carry).
  uint32_t session() const;
  // Completions the library dropped because the session that submitted
  // them died (they were nobody's to read).
  uint64_t dropped_completions() const;

  // Maps rank `rank`'s host-memory pool (the host default's "device" memory,
  // or the host tier), e.g. to write or check KV bytes.
  Result<PoolView> open_pool(uint32_t rank, PoolTier tier) const;

 private:
  struct Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvrelay

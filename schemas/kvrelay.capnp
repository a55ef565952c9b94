# kvrelay's messages: everything variable-length that crosses a process or
# host boundary (DESIGN.md section 4).
#
# Where they travel:
#   engine (client library)  -> submit ring       -> coordinator : SessionHello, CacheTask, CacheDest,
#                                                                  SwapTask, ConnectTask, Cancel,
#                                                                  RegisterPool
#   coordinator              -> task ring (rank r) -> worker r   : WorkerTask
#   coordinator              -> completion ring    -> engine     : Completion
#   worker <-> peer worker over TCP/RDMA (network transports)    : TransportHello, TransportHelloAck,
#                                                                  RdmaQpInfo, RdmaMemoryRegions, TcpFrameHeader
#
# A ring record's 32-bit type is the MessageType ordinal of the message it
# holds, so a reader (and kvrelay-dump) knows which struct to decode.
#
# Every field says what it means, its unit, and which process writes it.
# Block ids index a pool's block dimension ([num_blocks, kv_heads,
# block_size, head_dim]); layers index its layer dimension. All of it is
# validated by the receiver before use (schemas/validate.h): shared memory
# and sockets are input from another process.

@0xb7b525293b21d0ec;

$import "/capnp/c++.capnp".namespace("kvrelay::schema");

enum MessageType {
  invalid @0;
  cacheTask @1;
  cacheDest @2;
  swapTask @3;
  connectTask @4;
  cancel @5;
  registerPool @6;
  workerTask @7;
  completion @8;
  transportHello @9;
  transportHelloAck @10;
  rdmaQpInfo @11;
  rdmaMemoryRegions @12;
  tcpFrameHeader @13;
  sessionHello @14;
  netEnvelope @15;
  expectArrival @16;
  ipcLanded @17;
}

enum TransferProtocol {
  # How a prefill worker reaches the decode instance's pool for its rank.
  ipc @0;   # same host: map the peer pool (shared memory, or CUDA IPC for GPU pools)
  tcp @1;   # across hosts without RDMA: stream frames to the peer worker
  rdma @2;  # across hosts: RDMA WRITE into the peer pool (rdma-core verbs)
}

enum CacheDtype {
  bfloat16 @0;
  float16 @1;
  uint8 @2;
  fp8 @3;
}

# ---------------------------------------------------------------------------
# Engine -> coordinator (submit ring). Written by the engine's client library.

struct CacheTask {
  # The prefill half of a prefill->decode transfer: which local blocks hold the
  # request's KV cache, and how to follow its prefill. Submitted to the
  # prefill instance. Merged with the CacheDest of the same request id.

  requestId @0 :Text;
  # The engine's request id: 1..128 printable ASCII characters, no spaces.
  # Unique among the instance's live requests.

  srcBlockIds @1 :List(UInt32);
  # The request's block table on this (prefill) instance, in token order:
  # block i holds tokens [i*block_size, (i+1)*block_size). Each id < num_blocks.

  needPrefillTokens @2 :UInt64;
  # Tokens this request must prefill in total (the original's
  # need_prefill_tokens). Unit: tokens. The last chunk is the one whose signal
  # brings the prefilled count to this value.

  union {
    engineSlot @3 :UInt32;
    # Per-chunk mode: the engine's batch slot that prefills this request (the
    # original's current_id). Layer signals name slots; < 512.

    legacyPrefillStep @4 :UInt64;
    # Legacy per-query mode (the original's CacheMessager): the engine step at
    # which this request is prefilled; its layers are sent as soon as the
    # (step, layer) signal passes them. Steps are u64 and never wrap.
  }

  deadlineMs @5 :UInt32;
  # Per-request deadline, in milliseconds after submission; 0 takes the
  # instance's default. When it passes, the request completes with `timeout`.

  signalWatermarks @6 :List(UInt64);
  # Written by the client library: per rank, how many layer signals had been
  # pushed to that rank when this task was submitted (its signal ring's write
  # position). Untagged signals from before it belong to earlier requests and
  # are never attributed to this one. Empty: unknown (everything is eligible).

  clientSubmitNs @7 :UInt64;
  # Written by the client library: CLOCK_MONOTONIC (ns) when the engine
  # submitted it. Only timed (the dispatch path's first hop), never trusted
  # for anything else; 0: unknown.
}

struct SessionHello {
  # The first record of every engine attachment (a Client), written by the
  # client library. The record's producer slot and generation (in the ring
  # record header) identify the session; the coordinator answers in that
  # producer slot once the requests of dead sessions are withdrawn.
  pid @0 :UInt32;
  # The attaching process, for logs.
}

struct CacheDest {
  # The decode half: where the blocks go. Submitted to the prefill instance by
  # the engine once the decode side has allocated (the original's
  # dest_block_ids / transfer_protocol / ip / rdma_ports / device_ids).

  requestId @0 :Text;
  # Same rules as CacheTask.requestId; pairs the two halves.

  destBlockIds @1 :List(UInt32);
  # Block ids on the decode instance. May be shorter than srcBlockIds: the
  # decode side already holds the first len(src)-len(dest) blocks (prefix
  # cache) and those are never sent. No duplicates; each id < the decode
  # pool's num_blocks.

  protocol @2 :TransferProtocol;

  peerInstance @3 :Text;
  # ipc: the decode instance's name on this host (its control segment
  # /kvrelay-<peerInstance> leads to its pools).

  peerAddress @4 :Text;
  # tcp/rdma: the decode host's address (IPv4/IPv6 literal or host name).

  rdmaPorts @5 :List(UInt16);
  # rdma: one TCP port per TP rank, on which the decode rank's worker accepts
  # the RDMA connection handshake. Index = rank.

  tcpPorts @6 :List(UInt16);
  # tcp: one port per TP rank for the decode rank's frame receiver.

  deviceIds @7 :List(UInt32);
  # ipc: one entry per TP rank of this (prefill) instance: where that rank's
  # blocks go (the original's device_ids). For host-memory pools, the decode
  # rank that receives them: below the decode instance's tp_size, no rank twice.

  errorMessage @8 :Text;
  # Set (non-empty) instead of destBlockIds when the decode side could not
  # take the request (the original's error_msg); the request completes with
  # `error` carrying this text, and nothing is sent.

  clientSubmitNs @9 :UInt64;
  # As CacheTask.clientSubmitNs.

  requestNonce @10 :UInt64;
  # tcp/rdma/ipc: a secret the two engines share for this request, as
  # ExpectArrival.requestNonce (the decode engine chooses it, at random, when
  # it allocates the blocks, and it travels with destBlockIds). 0: none.
}

struct SwapTask {
  # Move blocks between the device tier and the host tier of this instance's
  # own pools (the original's transfer manager). One completion.

  requestId @0 :Text;
  # Same rules as CacheTask.requestId; also the ticket for per-layer waits.

  direction @1 :Direction;
  enum Direction {
    evict @0;  # device -> host, all requested layers, in the background
    load @1;   # host -> device, layer by layer, publishing a per-layer done counter
  }

  deviceBlockIds @2 :List(UInt32);
  hostBlockIds @3 :List(UInt32);
  # Pairs: deviceBlockIds[i] <-> hostBlockIds[i]. Equal lengths; each id below
  # its tier's num_blocks; no id twice within a list.

  firstLayer @4 :UInt32;
  layerCount @5 :UInt32;
  # Layers [firstLayer, firstLayer+layerCount); layerCount 0 means every layer
  # (extra speculative layers included).

  deadlineMs @6 :UInt32;
  # As CacheTask.deadlineMs.
}

struct ConnectTask {
  # Ask every rank to connect to a peer decode instance ahead of time (the
  # original's connect_rdma_task). Answered with one Completion: finished
  # when every rank connected (the AND of the ranks' answers).

  taskId @0 :UInt64;
  # The engine's id for this task; echoed in the completion's requestId as
  # "connect-<taskId>".

  protocol @1 :TransferProtocol;
  peerAddress @2 :Text;
  # As CacheDest.peerAddress.

  ports @3 :List(UInt16);
  # One port per TP rank (rdmaPorts for rdma, tcpPorts for tcp).

  peerInstance @4 :Text;
  # ipc: the peer instance name on this host.
}

struct ExpectArrival {
  # Submitted by the decode engine to its own (decode) instance: a request's
  # KV cache will arrive into these blocks, over tcp or ipc. Every rank then
  # accepts that request's writes only into them, refuses other requests'
  # writes into them, and the instance completes it once, with kind `arrived`, when
  # every byte of every layer has arrived on every rank (`timeout` at its
  # deadline). Written by the engine.

  requestId @0 :Text;
  # The request's id, as the prefill engine submits it (CacheTask.requestId).

  destBlockIds @1 :List(UInt32);
  # Its blocks here: CacheDest.destBlockIds of the same request. No
  # duplicates; each id below the pool's num_blocks.

  deadlineMs @2 :UInt32;
  # As CacheTask.deadlineMs.

  fromInstance @3 :Text;
  # The prefill instance whose workers send this request: the instance
  # named in a connection's authenticated hello (tcp, rdma), or the writing
  # instance (ipc). Writes of the request from any other instance are
  # refused and fail nothing, and only its early writes (before this
  # declaration) count. Empty: any peer that holds the key (weaker: such a
  # peer can then fill, fail or complete the request).

  requestNonce @4 :UInt64;
  # A secret the two engines share for this request (CacheDest.requestNonce
  # of the same request), chosen at random by the decode engine. The data
  # plane names the request by a keyed hash of its id and this nonce, so a
  # peer that holds the network key but not the nonce cannot address it at
  # all. 0: none (the request is named by its id alone, which anyone can
  # guess).
}

struct Cancel {
  # Withdraw a request. Exactly one completion still arrives for it
  # (`cancelled`, unless it had already finished). Written by the engine.
  requestId @0 :Text;
}

struct PoolDescriptor {
  # One rank's KV pool: num_layers (+ extra layers) x {K, V[, K scale, V scale]}
  # tensors of shape [num_blocks, kv_heads, block_size, head_dim].

  rank @0 :UInt32;
  tier @1 :Tier;
  enum Tier {
    device @0;  # the pool the engine computes on (GPU memory, or host memory on the host default)
    host @1;    # the offload tier of swap tasks
  }

  location @2 :Location;
  enum Location {
    hostSegment @0;  # a POSIX shared-memory segment, named in segmentName
    cudaIpc @1;
    # GPU memory from cudaMalloc: one legacy CUDA IPC handle
    # (cudaIpcGetMemHandle) per allocation in `memories`.
    cudaVmm @2;
    # GPU memory from the VMM API (cuMemCreate; e.g. PyTorch's expandable
    # segments): one POSIX file descriptor per allocation
    # (cuMemExportToShareableHandle), passed to the rank's worker over its
    # fd socket under `fdTicket`.
    hostFd @3;
    # Host memory the engine allocated: one file descriptor per allocation
    # (a memfd sealed against shrinking), passed as for cudaVmm.
  }

  segmentName @3 :Text;
  # hostSegment: the segment's name without the leading '/'.

  cudaIpcHandles @4 :List(Data);
  # Superseded by `memories` (never read).

  deviceId @5 :UInt32;
  # cudaIpc: the GPU that holds the pool.

  numLayers @6 :UInt32;
  extraLayers @7 :UInt32;
  # Speculative-decoding extra cache layers, after the model's layers.

  numBlocks @8 :UInt32;
  extraLayerBlocks @9 :UInt32;
  # Blocks in each extra layer (the original's num_gpu_block_expand_ratio).

  kvHeads @10 :UInt32;
  blockSize @11 :UInt32;
  # Tokens per block.
  headDim @12 :UInt32;
  dtype @13 :CacheDtype;

  hasScales @14 :Bool;
  # fp8 block-wise: float32 scale tensors of shape [num_blocks, kv_heads,
  # block_size] travel with K and V.

  hasValues @15 :Bool = true;
  # False for MLA latent caches, which have K (the latent) and no V.

  memories @16 :List(PoolMemory);
  # cudaIpc, cudaVmm, hostFd: the allocations that hold the pool's tensors
  # (one per tensor, or one for the whole pool, or anything between).

  tensors @17 :List(TensorPlace);
  # cudaIpc, cudaVmm, hostFd: where each tensor lies, layer-major:
  # [layer0 K, layer0 V, (layer0 K scale, layer0 V scale,) layer1 K, ...]
  # for every layer, extra layers included. A tensor is its blocks back to
  # back ([blocks, kv_heads, block_size, head_dim]), 16-byte aligned.

  fdTicket @18 :UInt64;
  # cudaVmm, hostFd: the ticket the rank's worker answered when the engine's
  # library passed it the file descriptors (it claims them with it).

  ownerPid @19 :UInt32;
  # cudaIpc, cudaVmm, hostFd: the process that allocated the memory, written
  # by the client library. The worker lets go of the memory when that
  # process exits (its GPU memory is then freed), and serves its own pool
  # again. 0: nobody to watch.

  deviceUuid @20 :Data;
  # GPU locations: the UUID of the GPU that holds the pool (16 bytes,
  # cudaDeviceProp::uuid). It names the same GPU in every process, whatever
  # CUDA_VISIBLE_DEVICES each was started with; deviceId is the engine's
  # ordinal, which means that GPU only in the engine's process. Empty from
  # clients that predate it (deviceId is then taken as the worker's ordinal).
}

struct PoolMemory {
  # One allocation another process made, as that process shares it.
  ipcHandle @0 :Data;
  # cudaIpc: the 64-byte cudaIpcMemHandle_t.
  fdIndex @1 :UInt32;
  # cudaVmm, hostFd: which of the file descriptors passed under fdTicket.
  bytes @2 :UInt64;
  # The allocation's size in bytes (for cudaVmm, as it was created: a
  # multiple of the device's allocation granularity).
  chunks @3 :List(VmmChunk);
  # cudaVmm, when this range of the engine's address space is several
  # allocations mapped back to back (PyTorch's expandable segments map 20
  # MiB at a time, so one large tensor spans many): each allocation's fd and
  # place, in order, covering [0, bytes) exactly. Empty: one allocation, the
  # fd at fdIndex.
}

struct VmmChunk {
  fdIndex @0 :UInt32;
  # Which of the file descriptors passed under fdTicket.
  offset @1 :UInt64;
  # Where the allocation is mapped, from the range's start.
  bytes @2 :UInt64;
  # Its size (a multiple of the allocation granularity).
}

struct TensorPlace {
  memory @0 :UInt32;
  # Index into `memories`.
  offset @1 :UInt64;
  # Bytes from the allocation's start to the tensor's first block.
}

struct RegisterPool {
  # Tell the instance where a rank's pool lives. Written by the engine (or by
  # the worker that created the pool itself).
  pool @0 :PoolDescriptor;
}

# ---------------------------------------------------------------------------
# Coordinator -> worker (task ring of one rank). Written by the coordinator.

struct WorkerTask {
  handle @0 :UInt64;
  # The coordinator's handle for the request: the worker's reports name it.

  requestId @1 :Text;
  # For logs.

  progressSlot @9 :UInt32 = 0xffffffff;
  # swap load: the SwapProgressTable slot where this rank publishes how many
  # layers it has loaded; 0xffffffff when there is none.

  progressGeneration @11 :UInt32;
  # swap load: the generation the progress slot was assigned with; the
  # worker's counts count only while the slot still holds it.

  union {
    bind @2 :CacheTask;
    # The prefill half, validated: follow its slot's (or legacy step's)
    # signals from now on. Sent as soon as it arrives, so no signal is missed.

    dest @3 :CacheDest;
    # The decode half, validated against its CacheTask: start sending, and
    # catch up at once on everything already prefilled.

    swap @4 :SwapTask;
    connect @5 :ConnectTask;
    cancel @6 :Void;
    # Withdraw `handle`: stop its copies, forget it, report `cancelled`.
    registerPool @7 :PoolDescriptor;
    shutdown @8 :Void;
    # The instance is shutting down: exit cleanly.
    sessionEnded @10 :UInt32;
    # An engine session (its id: producer slot << 16 | generation & 0xffff)
    # died: forget the signals it pushed that no request has claimed yet.
    expect @12 :ExpectArrival;
    # Track the arrival of this request's writes (tcp receiver, ipc receiver).
  }

  writtenNs @13 :UInt64;
  # CLOCK_MONOTONIC (ns) when the coordinator wrote it (the same for every
  # rank: it is encoded once). The worker times the hop with it; 0: unknown.
}

struct SendTask {
  # A merged prefill->decode pair, as the coordinator validates it (and as
  # the fuzzer feeds it).
  task @0 :CacheTask;
  dest @1 :CacheDest;
}

# ---------------------------------------------------------------------------
# Coordinator -> engine (completion ring). Written by the coordinator; the
# engine reads exactly one per request.

struct Completion {
  requestId @0 :Text;
  # The request's id; "connect-<taskId>" for connect tasks.

  kind @1 :Kind;
  enum Kind {
    cache @0;
    swap @1;
    connect @2;
    registerPool @3;
    other @4;  # a record that could not be decoded far enough to know
    cancel @5;  # the answer to a Cancel that was refused (rejected)
    arrived @6;  # an ExpectArrival: every byte is in this instance's pools
  }

  status @2 :Status;
  enum Status {
    finished @0;   # every rank finished; data is globally visible
    error @1;      # a rank failed (errorRank, message), or the input was invalid (errorRank -1)
    cancelled @2;  # withdrawn by Cancel before it finished
    timeout @3;    # its deadline passed; its work was withdrawn from every rank
    rejected @4;
    # This submission was refused without affecting any live request: a
    # duplicate half, a Cancel for an id that is not live, a record that
    # could not be decoded. Not the final completion of a request.
  }

  errorRank @3 :Int32 = -1;
  # The rank that failed, or -1 (not rank-specific: validation, timeout, ...).

  message @4 :Text;
  # Empty when finished; otherwise what went wrong, for a person to act on.

  bytesMoved @5 :UInt64;
  # Bytes copied by all ranks together. Unit: bytes.

  submittedNs @6 :UInt64;
  completedNs @7 :UInt64;
  # CLOCK_MONOTONIC timestamps (ns) of submission (the request's first part
  # reaching the coordinator) and completion.

  firstCopyNs @8 :UInt64;
  # CLOCK_MONOTONIC (ns) at which the first rank began copying for the
  # request; 0 when nothing was copied. Minus the engine's own submit time it
  # is the dispatch latency (plus any wait for layer signals).

  session @9 :UInt32;
  # The engine session that submitted the request (producer slot << 16 |
  # generation & 0xffff); 0 when unknown. The client library drops
  # completions of sessions that died: they are nobody's to read.

  blocksReusable @10 :Bool;
  # True when no rank can still write into the request's destination blocks
  # (every rank finished, confirmed it stopped, or was confirmed dead), so
  # the engine may give them to another request at once. False only when a
  # rank could not be confirmed stopped (an external worker that did not
  # answer): then the message says which, and the blocks must wait.
}

# ---------------------------------------------------------------------------
# Network transports: worker <-> peer worker handshakes. Written by the
# connecting (prefill) worker and answered by the accepting (decode) worker.

struct TransportHello {
  protocolVersion @0 :UInt32;
  # kvrelay wire protocol version; a mismatch is refused with both versions named.
  instance @1 :Text;
  # The connecting worker's instance name (for the peer's logs).
  rank @2 :UInt32;
  tpSize @3 :UInt32;
  # The connecting side's TP geometry (mismatched TP maps blocks by rank).
  pool @4 :PoolDescriptor;
  # The connecting side's pool geometry: the peer checks block sizes agree.
  expectedInstance @5 :Text;
  # The instance the connecting side means to reach (CacheDest.peerInstance);
  # the peer refuses if it is another one. Empty: any.
  totalKvHeads @6 :UInt32;
  # The model's KV heads over all the connecting side's ranks (0: pool
  # kvHeads x tpSize). A peer of another TP size (heterogeneous TP) must
  # serve the same number.
}

struct TransportHelloAck {
  accepted @0 :Bool;
  reason @1 :Text;
  # Why not, when refused.
  pool @2 :PoolDescriptor;
  # The accepting side's pool geometry.
  epoch @4 :UInt64;
  # The accepting worker's incarnation (CLOCK_REALTIME ns at its start): a
  # new value means the peer restarted and holds a new pool.
  proof @3 :Data;
  # Unused since wire version 2 (NetServerProof proves the key before the
  # hello, and the hello and its ack travel sealed).
  tpSize @5 :UInt32;
  totalKvHeads @6 :UInt32;
  # The accepting instance's TP size and the model's KV heads over its ranks
  # (0: unknown). A sender that split its heads for another layout
  # (heterogeneous TP) fails those transfers instead of writing wrong heads.
}

struct RdmaQpInfo {
  # RC queue-pair parameters exchanged before RTR/RTS (the original's lid, qpn,
  # psn, gid, mtu).
  lid @0 :UInt16;
  qpn @1 :UInt32;
  psn @2 :UInt32;
  gid @3 :Data;     # 16 bytes
  mtu @4 :UInt32;   # bytes: 256..4096
}

struct RdmaMemoryRegions {
  # Where the accepting side's tensors are, for RDMA WRITE.
  regions @0 :List(Region);
  struct Region {
    layer @0 :UInt32;
    tensor @1 :UInt32;   # 0 K, 1 V, 2 K scale, 3 V scale
    address @2 :UInt64;  # remote virtual address
    rkey @3 :UInt32;     # always 0 since wire version 3: keys come per grant (RdmaGrant)
    bytes @4 :UInt64;
  }
}

struct TcpFrameHeader {
  # Precedes `bytes` raw bytes on a tcp transport stream.
  handle @0 :UInt64;   # the sender's request handle, for the final ack
  layer @1 :UInt32;
  tensor @2 :UInt32;   # 0 K, 1 V, 2 K scale, 3 V scale
  dstOffset @3 :UInt64;
  # Byte offset in the destination tensor.
  bytes @4 :UInt64;
  last @5 :Bool;
  # The transfer's final frame: the receiver acks the transfer after its
  # payload is in the pool.
  transfer @6 :UInt64;
  # The sender's id of the transfer (one layer of one request) the frame
  # belongs to, echoed in the TcpAck.
  requestKey @7 :UInt64;
  # FNV-1a 64 of the request id (never 0): matches the frame with the decode
  # side's ExpectArrival of that request.
  runs @8 :List(TcpRun);
  # Since wire version 4: when not empty, the payload is these runs' bytes
  # back to back, each landing at its own dstOffset (scattered block ids:
  # one frame, one tag for many small blocks); `bytes` is their sum and
  # `dstOffset` is 0. Each run is checked as a frame of its own would be.
}

struct TcpRun {
  dstOffset @0 :UInt64;
  bytes @1 :UInt64;
}

struct IpcLanded {
  # Written by a prefill worker into a decode rank's landed ring (ipc, same
  # host) once a layer's copies into that rank's pool completed, or in their
  # place when the rank's claims refused the write: the decode worker counts
  # what landed for its expected requests (ExpectArrival) and fails one
  # whose rules a write broke. Input to the decode worker: every run is
  # checked against its pool and its claims before it counts.
  requestKey @0 :UInt64;
  # As TcpFrameHeader.requestKey.
  layer @1 :UInt32;
  firstBlocks @2 :List(UInt32);
  # Each run's first destination block.
  blockCounts @3 :List(UInt32);
  # Each run's length in blocks (every tensor of the layer).
  refused @4 :Bool;
  # Nothing was written: the claims refused these runs.
  firstHead @5 :UInt32;
  heads @6 :UInt32;
  # Heterogeneous TP: only heads [firstHead, firstHead + heads) of each block
  # were written (another prefill rank writes the others). heads 0: whole
  # blocks.
  writerInstance @7 :Text;
  # The writing (prefill) instance: checked against
  # ExpectArrival.fromInstance.
  landedNs @8 :UInt64;
  # When the writer saw these copies land (CLOCK_MONOTONIC, ns; both ends
  # share the host's clock), or 0. Timing only (the decode worker's
  # hop_landed_to_read and tail_last_landed_to_report): a stamp of 0 or from
  # the future is not timed, and no stamp changes what the record does.
}

struct NetChallenge {
  # The accepting side's first message on a connection.
  nonce @0 :Data;  # 32 random bytes
  mode @1 :UInt8;  # the session protection it runs: 1 authenticate, 2 encrypt
}

struct NetProof {
  # The connecting side's answer: it holds the pre-shared key.
  nonce @0 :Data;  # 32 random bytes of its own
  mode @1 :UInt8;  # the protection it runs (must be the challenge's)
  mac @2 :Data;
  # HMAC-SHA256(key, "kvrelay-net-v2 connect" || server nonce || this nonce || modes).
}

struct NetServerProof {
  # The accepting side's proof that it holds the key too, sent only once the
  # connecting side proved it holds it:
  # HMAC-SHA256(key, "kvrelay-net-v2 accept" || client nonce || server nonce || modes).
  mac @0 :Data;
}

struct TcpAck {
  # The receiver's answer to a transfer: every byte of it is in the pool
  # (ok), or why it was refused (and none of its later frames are written).
  transfer @0 :UInt64;
  ok @1 :Bool;
  reason @2 :Text;
}

struct NetEnvelope {
  # Every message on a network transport's connection (worker/net/): a
  # little-endian UInt32 length, then this struct (Cap'n Proto flat array,
  # length bytes). Once the handshake has derived the session's keys, every
  # envelope and every payload is followed by a 16-byte AES-GCM tag (and, in
  # the encrypting mode, is encrypted): worker/net/session_seal.h.
  #   -> challenge(nonce_s, mode)                      accepting side, first
  #   <- proof(nonce_c, mode, mac_c)                   refused: closed, logged
  #   -> serverProof(mac_s)                            sealed from here on:
  #   <- hello(instance, rank, tp, pool geometry, instance expected)
  #   -> helloAck(accepted | reason, pool geometry, epoch)
  #   <> message(protocol, kind, body)                 a transport's own
  #   <> heartbeat                                     whenever the line is quiet
  union {
    challenge @0 :NetChallenge;
    proof @1 :NetProof;
    serverProof @2 :NetServerProof;
    hello @3 :TransportHello;
    helloAck @4 :TransportHelloAck;
    heartbeat @5 :Void;
    message @6 :TransportMessage;
  }
}

struct TransportMessage {
  # A message of one transport, which worker/net/ carries without reading:
  # `protocol` routes it to the handler that transport registered, `kind`
  # and `body` are that transport's own (worker/tcp/frame_wire.h,
  # worker/rdma/control_wire.h).
  protocol @0 :UInt8;
  kind @1 :UInt16;
  body @2 :AnyPointer;
}

struct TcpMessage {
  # tcp (protocol 1): frames from the sender, acks from the receiver.
  #   <- frame(transfer, handle, layer, tensor, offset | runs, bytes, last) + payload ...
  #   -> ack(transfer, ok | reason)     after the transfer's last payload is in the pool
  union {
    frame @0 :TcpFrameHeader;
    ack @1 :TcpAck;
  }
}

struct RdmaMessage {
  # rdma (protocol 2): the control messages of an rdma session
  # (worker/rdma/rdma_transport.h), on an authenticated connection:
  #   <- offer(queue pairs)                  after the helloAck
  #   -> accept(queue pairs, regions | reason)
  #   <- intent(transfer, blocks) ...        before its writes
  #   -> grant(transfer, rkeys | reason) ... only then are they posted
  #   -> ack(transfer, ok | reason)          its WRITE_WITH_IMM has landed
  union {
    offer @0 :RdmaOffer;
    accept @1 :RdmaAccept;
    intent @2 :RdmaIntent;
    grant @3 :TcpAck;
    # Unused since wire version 3 (keyGrant carries the keys to write with).
    ack @4 :TcpAck;
    keyGrant @5 :RdmaGrant;
  }
}

struct RdmaGrant {
  # The receiver's answer to an intent: one part for each part of the
  # intent, in order, once its last part is in (a refusal: one part, ok
  # false, last). The sender posts the transfer's writes only once the last
  # part is in, and writes each run of each tensor with the key granted for
  # it, on the queue pair the intent named.
  transfer @0 :UInt64;
  ok @1 :Bool;
  reason @2 :Text;
  # Why not, when refused.
  rkeys @3 :List(UInt32);
  # One per run of the matching intent part and tensor of the layer, run by
  # run (a run's tensors in their order in a layer): the key that writes that
  # run's blocks of that tensor, and only those (where the receiver binds a
  # memory window per grant; the pool's registration otherwise).
  last @4 :Bool;
}

struct RdmaOffer {
  # The connecting side's RC queue pairs for an rdma session, in the order
  # it will use them.
  queuePairs @0 :List(RdmaQpInfo);
}

struct RdmaAccept {
  # The accepting side's answer to an RdmaOffer: a queue pair connected to
  # each offered one (same order), and where its pool's tensors are.
  accepted @0 :Bool;
  reason @1 :Text;
  queuePairs @2 :List(RdmaQpInfo);
  regions @3 :RdmaMemoryRegions;
}

struct RdmaIntent {
  # What one layer transfer will write, asked before any write is posted, so
  # that the receiver can refuse blocks its expected requests do not allow
  # (one-sided writes cannot be refused once they are on the wire). Long
  # transfers come in parts; the receiver answers after the last one.
  transfer @0 :UInt64;
  # The sender's id; its low 32 bits are the immediate of its last write.
  requestKey @1 :UInt64;
  handle @2 :UInt64;
  layer @3 :UInt32;
  runs @4 :List(BlockSpan);
  # Destination block ranges; every tensor of the layer is written over them.
  last @5 :Bool;
  firstHead @6 :UInt32;
  heads @7 :UInt32;
  # Heterogeneous TP: only heads [firstHead, firstHead + heads) of each block
  # are written (other prefill ranks write the others). heads 0: whole blocks.
  queuePair @8 :UInt32;
  # Which of the offered queue pairs the writes go on (since wire version 3):
  # the keys granted for them serve that queue pair alone.
  struct BlockSpan {
    first @0 :UInt32;
    count @1 :UInt32;
  }
}

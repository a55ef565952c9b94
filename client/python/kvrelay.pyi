"""kvrelay's engine-side client (the compiled module; this file is its type stubs).

Submit KV-cache transfer and swap requests to a kvrelay instance, push the
model's layer signals, and read exactly one completion per request.

Contract (as for the C++ client):
  * exactly one completion per request ('finished', 'error', 'cancelled' or
    'timeout'); a refused submission gets one 'rejected' completion, which
    does not end the request of that id;
  * every Client is an engine session: if its process dies, the requests it
    submitted are withdrawn and their completions dropped; closing a Client
    leaves its requests running (their completions still arrive); a restarted
    engine may reuse its predecessor's request ids once Client() returns;
  * one completion reader per instance (the engine's scheduler), enforced:
    the first Client to poll or wait becomes it and receives every
    completion; another gets Error (busy) naming it until it is closed;
  * one signal-producing process per rank (the rank's model runner), any of
    whose threads may push; a second process gets an Error (busy);
  * step numbers: each push_batch starts a new batch, whose push_layer_done
    calls carry the same step; steps should grow, and a step number used
    again starts a new batch all the same;
  * signals with a request (a tag) may come before or after the request's
    submit_cache_task; untagged signals (the original's protocol) must come
    after it, and are stamped with the request their slot was last given;
  * any number of submitters, in any number of processes and threads.

Timeouts are in seconds and bound every wait: nothing waits forever. Calls
that may wait release the GIL. A Client may be shared between threads: the
completion reader is serialised for you. Request ids are printable ASCII
without spaces or NUL bytes (InvalidArgument otherwise).
"""

from typing import Iterable, Iterator, Optional, SupportsIndex, Tuple, Union

__version__: str

BlockIds = Iterable[SupportsIndex]
"""Block ids: a list, tuple, range, numpy integer array, ... of ints >= 0."""

BatchEntry = Union[
    Tuple[SupportsIndex, SupportsIndex, SupportsIndex],
    Tuple[SupportsIndex, SupportsIndex, SupportsIndex, Union[SupportsIndex, str, None]],
]
"""(slot, chunk_token_offset, chunk_len[, request]): request is the request id
(or its Client.request_tag), so that signals reaching a worker before the
request's task are attributed exactly."""

class Error(Exception):
    """Base class of every kvrelay error. str(e) is the message to show."""

class InvalidArgument(Error, ValueError):
    """Bad input; nothing was submitted."""

class RingFull(Error):
    """A ring stayed full until the timeout; nothing was written."""

class Timeout(Error, TimeoutError):
    """Nothing arrived before the timeout."""

class CoordinatorGone(Error, ConnectionError):
    """The instance's coordinator died or the instance shut down; attach
    again once a new coordinator is up."""

class NotFound(Error, LookupError):
    """No such instance, pool or request."""

class Aborted(Error):
    """The load waited on failed or was cancelled."""

class PermissionDenied(Error, PermissionError):
    """The instance's segments belong to another user."""

class Unsupported(Error, NotImplementedError):
    """This build or machine cannot do it (no CUDA, no GPU)."""

class Completion:
    """The one completion of a request (or of a rejected submission)."""

    @property
    def request_id(self) -> str:
        """The request (or, for kind 'connect', "connect-<task id>")."""
    @property
    def kind(self) -> str:
        """'cache', 'swap', 'connect', 'register_pool', 'cancel', 'arrived' or 'other'."""
    @property
    def status(self) -> str:
        """'finished', 'error', 'cancelled', 'timeout' or 'rejected'."""
    @property
    def ok(self) -> bool:
        """status == 'finished'."""
    @property
    def error_rank(self) -> Optional[int]:
        """The rank that failed the request, or None."""
    @property
    def message(self) -> str:
        """Why it failed, naming the rank, peer or block; empty when finished."""
    @property
    def bytes_moved(self) -> int:
        """Bytes this request moved, over all ranks."""
    @property
    def submitted_ns(self) -> int:
        """CLOCK_MONOTONIC (time.monotonic_ns())."""
    @property
    def completed_ns(self) -> int:
        """CLOCK_MONOTONIC, when the request ended."""
    @property
    def first_copy_ns(self) -> int:
        """When the first rank began copying for the request (0: nothing
        copied); minus the engine's submit time, the dispatch latency."""
    @property
    def blocks_reusable(self) -> bool:
        """True when no rank can still write into the request's destination
        blocks, so they may be reused at once; False only when a rank could
        not be confirmed stopped (the message says which)."""
    @property
    def latency_s(self) -> float:
        """completed_ns - submitted_ns, in seconds."""

class Pool:
    """One rank's host-memory KV pool, mapped into this process."""

    @property
    def name(self) -> str:
        """The shared-memory segment's name."""
    @property
    def num_layers(self) -> int:
        """Layers of the model (speculative extra layers not counted)."""
    @property
    def extra_layers(self) -> int:
        """Speculative extra layers after num_layers (e.g. MTP), each of
        extra_layer_blocks blocks."""
    @property
    def num_blocks(self) -> int:
        """Blocks per layer."""
    @property
    def extra_layer_blocks(self) -> int:
        """Blocks in each extra layer."""
    @property
    def kv_heads(self) -> int:
        """KV heads on this rank (1 for an MLA latent cache)."""
    @property
    def block_size(self) -> int:
        """Tokens per block."""
    @property
    def head_dim(self) -> int:
        """Values per token and head (bytes per token for the uint8 dtype)."""
    @property
    def dtype(self) -> str:
        """'bfloat16', 'float16', 'uint8' or 'fp8'."""
    @property
    def tensors(self) -> list[str]:
        """['k', 'v'] or ['k', 'v', 'k_scale', 'v_scale']."""
    def block_bytes(self, tensor: Union[str, int] = "k") -> int:
        """Bytes of one block of one tensor ('k', 'v', 'k_scale', 'v_scale'
        or its index in `tensors`)."""
    def tensor(self, layer: int, tensor: Union[str, int]) -> memoryview:
        """A writable view of a whole tensor of one layer, [num_blocks, kv_heads,
        block_size, head_dim] of the pool's dtype: the KV cache in place, e.g.
        torch.frombuffer(view, dtype=torch.bfloat16).view(...). No copy."""
    def block(self, layer: int, tensor: Union[str, int], block_id: int) -> memoryview:
        """A writable view of one block (np.frombuffer(view, dtype) for an
        array). The view keeps the mapping alive."""

class Client:
    """The engine-side client of one kvrelay instance."""

    def __init__(self, instance: str, timeout: float = 30.0) -> None:
        """Attaches to `instance`, waiting up to `timeout` seconds for it to
        be ready. Raises NotFound (no such instance), Timeout (not ready in
        time), CoordinatorGone, PermissionDenied."""
    @property
    def instance(self) -> str:
        """The instance's name, as given to kvrelay-coordinator --instance."""
    @property
    def tp_size(self) -> int:
        """Tensor-parallel ranks of the instance."""
    @property
    def num_layers(self) -> int:
        """Layers of the model (config has the rest of the geometry)."""
    @property
    def config(self) -> dict[str, object]:
        """The instance's configuration: role, tp_size, geometry, ..."""
    @property
    def closed(self) -> bool:
        """True once close() was called (or the with block ended)."""
    @property
    def epoch(self) -> int:
        """The instance's epoch: a restarted instance has a new one."""
    @property
    def session(self) -> int:
        """This attachment's engine session id (completions carry it)."""
    @property
    def dropped_completions(self) -> int:
        """Completions dropped because the session that submitted them died."""
    def rank_ready(self, rank: int) -> bool:
        """The original's cache_ready_signal: rank `rank` is serving."""
    def coordinator_alive(self) -> bool:
        """Whether the instance's coordinator is still alive."""
    @staticmethod
    def request_tag(request_id: str) -> int:
        """The 32-bit tag of a request id (never 0), for batch entries."""
    @staticmethod
    def random_nonce() -> int:
        """A request nonce from the system's CSPRNG (never 0): see
        expect_arrival's request_nonce."""

    # ---- submissions: each waits up to `timeout` for ring room (RingFull) ----
    def submit_cache_task(
        self,
        request_id: str,
        src_block_ids: BlockIds,
        need_prefill_tokens: int,
        *,
        engine_slot: Optional[int] = None,
        legacy_prefill_step: Optional[int] = None,
        deadline_ms: int = 0,
        timeout: float = 5.0,
    ) -> None:
        """The prefill half. Give engine_slot (per-chunk mode) or
        legacy_prefill_step (legacy per-query mode). deadline_ms 0: the
        instance's default."""
    def submit_cache_dest(
        self,
        request_id: str,
        dest_block_ids: BlockIds,
        *,
        protocol: str = "ipc",
        peer_instance: str = "",
        peer_address: str = "",
        rdma_ports: Optional[BlockIds] = None,
        tcp_ports: Optional[BlockIds] = None,
        device_ids: Optional[BlockIds] = None,
        error_message: str = "",
        request_nonce: int = 0,
        timeout: float = 5.0,
    ) -> None:
        """The decode half. dest_block_ids may be shorter than the source:
        the decode side already holds the first len(src) - len(dest) blocks.
        A non-empty error_message fails the request with that text.
        request_nonce: the one the decode engine gave expect_arrival."""
    def submit_swap(
        self,
        request_id: str,
        direction: str,
        device_block_ids: BlockIds,
        host_block_ids: BlockIds,
        *,
        first_layer: int = 0,
        layer_count: int = 0,
        deadline_ms: int = 0,
        timeout: float = 5.0,
    ) -> None:
        """direction 'evict' (device -> host) or 'load' (host -> device,
        layer by layer: see wait_layer). layer_count 0: all layers."""
    def expect_arrival(
        self,
        request_id: str,
        dest_block_ids: BlockIds,
        *,
        deadline_ms: int = 0,
        from_instance: str = "",
        request_nonce: int = 0,
        timeout: float = 5.0,
    ) -> None:
        """Decode side (tcp or ipc): this request's KV will arrive into
        dest_block_ids. Its completion (kind 'arrived') comes when every
        byte is here on every rank; until then only it may write them.
        from_instance: the prefill instance that sends it (only its writes
        count; empty: any peer holding the key). request_nonce: a secret
        shared with the prefill engine's submit_cache_dest (random_nonce());
        a peer without it cannot name the request."""
    def connect(
        self,
        task_id: int,
        *,
        protocol: str = "ipc",
        peer_instance: str = "",
        peer_address: str = "",
        ports: Optional[BlockIds] = None,
        timeout: float = 5.0,
    ) -> None:
        """Pre-connects to a peer; the completion's id is f"connect-{task_id}"."""
    def cancel(self, request_id: str, *, timeout: float = 5.0) -> None:
        """Withdraws the request: its one completion says 'cancelled' (or how
        it ended, if it ended first). A cancel for an id that is not live
        gets a 'rejected' completion instead."""
    def register_pool(
        self, rank: int, segment_name: str, *, host_tier: bool = False, timeout: float = 5.0
    ) -> None:
        """Tells rank `rank`'s worker to serve its pool (host_tier: its swap
        tier) from the host shared-memory segment `segment_name` from now on
        (refused while it has requests in flight); the completion (kind
        'register_pool') says whether the worker mapped it."""
    def register_host_fd_pool(
        self,
        rank: int,
        memories: Iterable[Tuple[int, int]],
        tensors: Iterable[Tuple[int, int]],
        *,
        host_tier: bool = False,
        timeout: float = 5.0,
    ) -> None:
        """Registers host memory the engine allocated in memfds (os.memfd_create,
        sealed with F_SEAL_SHRINK): `memories` is (fd, bytes) per memfd, and
        `tensors` is (memory index, byte offset) per tensor, layer-major:
        [layer 0 K, layer 0 V, (K scale, V scale,) layer 1 K, ...] (a K-only
        pool, an MLA latent cache: [layer 0 K, (K scale,) layer 1 K, ...]), each
        16-byte aligned. The engine keeps its fds. The completion (kind
        "register_pool") says whether the worker mapped it, or why not."""
    def register_cuda_pool(
        self, rank: int, tensors: Iterable[int], *, host_tier: bool = False, timeout: float = 5.0
    ) -> None:
        """Registers GPU memory by the device address of each tensor
        (tensor.data_ptr()), layer-major: [layer 0 K, layer 0 V, (K scale,
        V scale,) layer 1 K, ...]; a K-only pool (an MLA latent cache) has one
        per layer (and its scale). cudaMalloc memory is shared by legacy IPC
        handle, VMM memory (PyTorch's expandable segments) by POSIX fds.
        Raises Unsupported without CUDA or a GPU."""

    # ---- layer signals (one producer per rank) ----
    def own_signals(self, rank: int) -> None:
        """Takes rank `rank`'s signal ring for this process now rather than
        at the first push (do it outside a CUDA callback). Raises Error
        (busy) when another process pushes to that rank."""
    def push_batch(
        self, rank: int, step: int, slots: Iterable[BatchEntry], *, timeout: float = 5.0
    ) -> None:
        """A step's batch: before the step's first push_layer_done. Each call
        starts a new batch, even with a step number used before. Slots are
        0..511 (InvalidArgument otherwise)."""
    def push_layer_done(self, rank: int, step: int, layer: int, *, timeout: float = 5.0) -> None:
        """Layer `layer` of step `step` (the current batch's step) is computed
        for every slot of its batch. Layers beyond the instance's are refused
        (InvalidArgument)."""
    def push_legacy_layer_done(
        self, rank: int, step: int, layer: int, *, timeout: float = 5.0
    ) -> None:
        """Legacy per-query mode: (step, layer) is the newest computed position."""

    # ---- swap loads ----
    def wait_layer(
        self, request_id: str, layer: int, *, rank: Optional[int] = None, timeout: float = 30.0
    ) -> None:
        """Returns once layer `layer` of load `request_id` is back on every
        rank (or on `rank`). Raises Aborted (the load failed or was
        cancelled), InvalidArgument (the load does not cover the layer),
        Timeout."""

    def stream_wait_layer(
        self,
        request_id: str,
        layer: int,
        stream: int,
        *,
        rank: Optional[int] = None,
        timeout: float = 30.0,
    ) -> None:
        """Enqueues on `stream` (torch.cuda.current_stream().cuda_stream) a
        wait until layer `layer` of load `request_id` is on the device: the
        stream's later work runs then, with no host thread. Returns once
        enqueued. A failed load releases the stream too: check its
        completion. Raises Unsupported without CUDA or a GPU."""

    # ---- GPU-written layer signals (CUDA graphs) ----
    def own_device_signals(self, rank: int) -> None:
        """Takes rank `rank`'s signal ring and pins its device signal word
        for the current CUDA device."""
    def push_device_step(
        self,
        rank: int,
        step: int,
        slots: Iterable[BatchEntry],
        layers: int,
        stream: int,
        *,
        timeout: float = 5.0,
    ) -> None:
        """Before launching a step (outside any CUDA graph): its batch, and
        that `stream` will signal its `layers` layers (signal_layer)."""
    def signal_layer(self, rank: int, layer: int, stream: int) -> None:
        """After layer `layer`'s KV is written, on the stream that wrote it:
        one tiny kernel, capturable in a CUDA graph."""

    # ---- completions (one reader) ----
    def own_completions(self) -> None:
        """Becomes the instance's one completion reader now (the first poll
        or wait does otherwise). Raises Error (busy), naming the reader, when
        another Client (in any process) is it."""
    def poll(self) -> Optional[Completion]:
        """The next completion if one is waiting, else None."""
    def wait(self, timeout: float) -> Completion:
        """The next completion; Timeout if none arrives in time."""
    def completions(self, timeout: float = 0.0) -> Iterator[Completion]:
        """Completions as they arrive, until none arrives within `timeout`
        seconds of the previous one (0: only those already waiting)."""

    # ---- pools ----
    def open_pool(self, rank: int, *, host_tier: bool = False) -> Pool:
        """Maps rank `rank`'s pool (host_tier: its swap tier) into this process:
        its tensors as writable memoryviews, no copy. The host default pool
        or a host-fd pool only; a CUDA pool is the engine's own memory."""

    def close(self) -> None:
        """Detaches; later calls raise InvalidArgument."""
    def __enter__(self) -> "Client": ...
    def __exit__(self, *exc: object) -> None: ...

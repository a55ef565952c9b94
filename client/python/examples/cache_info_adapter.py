"""Move an engine that used FastDeploy's cache messager onto kvrelay.

The original engine talks to its messager processes through
EngineWorkerQueue: it puts `cache_info` dictionaries (one per half of a
request), its model runner sends each layer's kv signal through a SysV
message queue, and it reads `(request_id, status)` tuples back with
get_finished_req. CacheInfoAdapter keeps those shapes and maps them onto a
kvrelay.Client, so that the engine's call sites change in one place:

    original                                   kvrelay
    engine_worker_queue.put_cache_info(infos)  adapter.put_cache_info(infos)
    another rank's messager: get_cache_info()  adapter.seen_cache_info(infos)
    get_output_kv_signal -> kv_signal_data     adapter.kv_signal(rank, step, kv_signal_data)
    prefilled step/layer shm (legacy mode)     adapter.legacy_layer_done(rank, step, layer)
    put_connect_rdma_task(task)                adapter.connect_task(task)
    get_finished_req()                         adapter.get_finished_req(timeout)
    cache_ready_signal[rank]                   adapter.client.rank_ready(rank)

There is nothing to poll every millisecond and no barrier to line up: the
halves are merged by kvrelay's coordinator, the ranks are synchronised by its
workers, and each request gets exactly one completion.

Run against two running instances (see docs/engine-api.md):

    python3 cache_info_adapter.py --prefill P --decode D
"""

from __future__ import annotations

import argparse
from typing import Callable, Iterable, Iterator, Mapping, Sequence, Union

import kvrelay

# The original's finished-request statuses.
FINISHED = "finished"
WRITE_CACHE_ERROR = "write cache error"
CONNECT_ERROR = "connect error"


class CacheInfoAdapter:
    """The original's cache_info protocol on top of a kvrelay.Client.

    mode: "per_chunk" (the V1 messager: a prefill half's current_id is the
    engine's batch slot, and layer signals carry each step's batch) or
    "legacy" (the original CacheMessager: current_id is the prefill step, and
    signals carry only the newest (step, layer)).

    ipc_peer: the kvrelay instance of the decode side for transfer_protocol
    "ipc": an instance name, or a function of the decode half's dictionary
    (the original found the peer through its device_ids on the same host).
    """

    def __init__(
        self,
        client: kvrelay.Client,
        *,
        mode: str = "per_chunk",
        ipc_peer: Union[str, Callable[[Mapping], str]] = "",
        timeout: float = 5.0,
    ) -> None:
        if mode not in ("per_chunk", "legacy"):
            raise ValueError(f"mode {mode!r} is not 'per_chunk' or 'legacy'")
        self.client = client
        self.mode = mode
        self.ipc_peer = ipc_peer
        self.timeout = timeout
        self._slot_request: dict[int, str] = {}  # engine slot -> request id, for batch tags
        self._connect_responses: list[dict] = []

    # ---- EngineWorkerQueue.put_cache_info ----
    def put_cache_info(self, cache_info: Iterable[Mapping]) -> None:
        """Submits each dictionary as the half it is: the prefill half has
        src_block_ids, the decode half dest_block_ids or error_msg. Raises
        kvrelay.InvalidArgument (with the reason) for a malformed half;
        nothing of that half was submitted."""
        for info in cache_info:
            request_id = str(info["request_id"])
            if "src_block_ids" in info:
                self._put_prefill_half(request_id, info)
            if "dest_block_ids" in info or info.get("error_msg"):
                self._put_decode_half(request_id, info)

    def seen_cache_info(self, cache_info: Iterable[Mapping]) -> None:
        """On a TP rank that does not submit (in the original, every rank's
        messager read the same cache_info from its queue): records which
        request each engine slot now holds, so that this rank's kv_signal
        tags its batch with the request ids too. A signal tagged with its
        request is attributed to it even when it reaches kvrelay after the
        slot has gone to the next request. Submits nothing."""
        if self.mode != "per_chunk":
            return
        for info in cache_info:
            if "src_block_ids" in info:
                self._slot_request[int(info["current_id"])] = str(info["request_id"])

    def _put_prefill_half(self, request_id: str, info: Mapping) -> None:
        current_id = int(info["current_id"])
        if self.mode == "per_chunk":
            self._slot_request[current_id] = request_id
            self.client.submit_cache_task(
                request_id,
                info["src_block_ids"],
                int(info["need_prefill_tokens"]),
                engine_slot=current_id,
                timeout=self.timeout,
            )
        else:
            self.client.submit_cache_task(
                request_id,
                info["src_block_ids"],
                int(info.get("need_prefill_tokens", 0)),
                legacy_prefill_step=current_id,
                timeout=self.timeout,
            )

    def _put_decode_half(self, request_id: str, info: Mapping) -> None:
        protocol = info.get("transfer_protocol", "ipc")
        peer = ""
        if protocol == "ipc":
            peer = self.ipc_peer(info) if callable(self.ipc_peer) else self.ipc_peer
        # The original padded dest_block_ids on the left with -1 for blocks the
        # decode side had cached; kvrelay takes the unpadded list (shorter than
        # the source means "the first blocks are cached"), so drop any padding.
        dest = [b for b in info.get("dest_block_ids", []) if b != -1]
        self.client.submit_cache_dest(
            request_id,
            dest,
            protocol=protocol,
            peer_instance=peer,
            peer_address=str(info.get("ip", "")),
            rdma_ports=[int(p) for p in info.get("rdma_ports", [])] or None,
            device_ids=[int(d) for d in info.get("device_ids", [])] or None,
            error_message=str(info.get("error_msg") or ""),
            # kvrelay's only addition to the dictionary, optional: the nonce
            # the decode engine gave expect_arrival (see Client.random_nonce).
            request_nonce=int(info.get("request_nonce", 0)),
            timeout=self.timeout,
        )

    # ---- the model runner's layer signal ----
    def kv_signal(self, rank: int, step: int, kv_signal_data: Sequence[int]) -> None:
        """The original's `(512*3+2)` int32 signal of one layer of one step:
        [count, layer_id, (slot, chunk_token_offset, chunk_len) x count].
        `step` numbers the engine's forward steps (it never wraps). At layer 0
        the step's batch goes first, with each slot's request id so that a
        signal reaching kvrelay before its task is attributed exactly."""
        count, layer = int(kv_signal_data[0]), int(kv_signal_data[1])
        if count < 0:
            return  # the original's "no task" marker (-1)
        if layer == 0:
            entries = []
            for i in range(count):
                slot, offset, length = (int(v) for v in kv_signal_data[2 + 3 * i : 5 + 3 * i])
                entries.append((slot, offset, length, self._slot_request.get(slot)))
            self.client.push_batch(rank, step, entries, timeout=self.timeout)
        self.client.push_layer_done(rank, step, layer, timeout=self.timeout)

    def legacy_layer_done(self, rank: int, step: int, layer: int) -> None:
        """Legacy mode: the values the original wrote into its "prefilled
        step" and "prefilled layer" shm segments (unwrapped: steps never wrap)."""
        self.client.push_legacy_layer_done(rank, step, layer, timeout=self.timeout)

    # ---- EngineWorkerQueue.put_connect_rdma_task ----
    def connect_task(self, task: Mapping) -> None:
        """The original's {"task_id", "ip", "rdma_ports"} connect task; its
        answer comes back through get_connect_responses."""
        ports = task.get("rdma_ports", task.get("rdma_port", []))
        if isinstance(ports, (int, str)):
            ports = [ports]
        self.client.connect(
            int(task["task_id"]),
            protocol=task.get("transfer_protocol", "rdma"),
            peer_instance=task.get("peer_instance", ""),
            peer_address=str(task.get("ip", "")),
            ports=[int(p) for p in ports],
            timeout=self.timeout,
        )

    # ---- EngineWorkerQueue.get_finished_req ----
    def get_finished_req(self, timeout: float = 0.0) -> list[tuple[str, str]]:
        """(request_id, status) of every request that ended, with the
        original's statuses: "finished", or "write cache error" (the
        completion's message says why). Waits up to `timeout` seconds for the
        first one. Connect answers are kept for get_connect_responses."""
        finished = []
        for c in self._ended(timeout):
            if c.kind == "connect":
                task_id = int(c.request_id.removeprefix("connect-"))
                self._connect_responses.append(
                    {"task_id": task_id, "success": c.ok, "message": c.message})
                continue
            if c.status == "rejected":
                # A refused submission (e.g. a duplicate half): the request of
                # that id is not ended by it. The original had no such answer.
                continue
            finished.append((c.request_id, FINISHED if c.ok else WRITE_CACHE_ERROR))
            self._slot_request = {s: r for s, r in self._slot_request.items() if r != c.request_id}
        return finished

    def _ended(self, timeout: float) -> Iterator[kvrelay.Completion]:
        """The first completion within `timeout`, then those already waiting
        (Client.completions(timeout) would wait `timeout` after each one)."""
        try:
            first = self.client.wait(timeout) if timeout > 0 else self.client.poll()
        except kvrelay.Timeout:
            return
        if first is None:
            return
        yield first
        yield from self.client.completions(0.0)

    def get_connect_responses(self) -> list[dict]:
        """Answers to connect_task, as {"task_id", "success", "message"}."""
        out, self._connect_responses = self._connect_responses, []
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefill", required=True, help="the prefill instance")
    parser.add_argument("--decode", required=True, help="the decode instance")
    args = parser.parse_args()

    with kvrelay.Client(args.prefill) as client:
        adapter = CacheInfoAdapter(client, ipc_peer=args.decode)
        tp, layers = client.tp_size, client.num_layers
        block = client.config["block_size"]
        # One request of three blocks, prefilled in one chunk in engine slot 0.
        adapter.put_cache_info([
            {"request_id": "example-0", "src_block_ids": [0, 1, 2], "current_id": 0,
             "need_prefill_tokens": 3 * block},
            {"request_id": "example-0", "dest_block_ids": [5, 6, 7], "transfer_protocol": "ipc",
             "ip": "127.0.0.1", "device_ids": list(range(tp))},
        ])
        for rank in range(tp):
            for layer in range(layers):
                adapter.kv_signal(rank, 0, [1, layer, 0, 0, 3 * block])
        print(adapter.get_finished_req(timeout=10.0))


if __name__ == "__main__":
    main()

"""How a prefill rank tells kvrelay what it does, in one of two ways:

- `DirectCalls`: kvrelay.Client's own API (submit_cache_task,
  submit_cache_dest, push_batch, push_layer_done, wait).
- `AdapterCalls` (--adapter): the calls of an engine written against
  FastDeploy's cache messager, unchanged, through CacheInfoAdapter
  (client/python/examples/cache_info_adapter.py): `cache_info` dictionaries
  for both halves of a request (the decode half's dest_block_ids padded on
  the left with -1 for the blocks the decode side had cached, as the
  original did), the `[count, layer, (slot, offset, length) x count]` kv
  signal after each layer, and get_finished_req's (request_id, status).

Both are used the same way by engine.prefill_rank: every rank calls
enter_slots / start_step / layer_done; only the scheduler (rank 0) submits
the decode halves and reads the completions.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .schedule import Plan


class DirectCalls:
    def __init__(self, client, rank: int, scheduler: bool, plan: Plan, route: dict,
                 timeout: float) -> None:
        self.client, self.rank, self.scheduler = client, rank, scheduler
        self.plan, self.route, self.timeout = plan, route, timeout

    def enter_slots(self, entering: list) -> None:
        """Requests entering engine slots this step (chunks): their CacheTasks."""
        if not self.scheduler:
            return
        for c in entering:
            req = self.plan.requests[c.request]
            self.client.submit_cache_task(req.id, self.plan.src_tables[c.request], len(req.prompt),
                                          engine_slot=c.slot)

    def submit_dest(self, r: int, blocks: list[int], nonce: int) -> None:
        route = self.route
        self.client.submit_cache_dest(self.plan.requests[r].id, blocks, protocol=route["protocol"],
                                      peer_instance=route["decode_instance"],
                                      peer_address=route.get("address", ""),
                                      tcp_ports=route.get("tcp_ports"),
                                      rdma_ports=route.get("rdma_ports"),
                                      device_ids=route.get("device_ids"), request_nonce=nonce)

    def start_step(self, number: int, step: list) -> None:
        self.client.push_batch(self.rank, number, [
            (c.slot, c.offset, c.length, self.plan.requests[c.request].id) for c in step])

    def layer_done(self, number: int, layer: int, step: list) -> None:
        self.client.push_layer_done(self.rank, number, layer)

    def next_completion(self) -> tuple:
        c = self.client.wait(timeout=self.timeout)
        return ("prefill", c.request_id, c.status, c.message, c.bytes_moved)


def _import_adapter():
    try:
        import cache_info_adapter
    except ImportError:  # run from the source tree: the adapter beside the Python client
        sys.path.append(str(Path(__file__).resolve().parents[2] / "client" / "python" / "examples"))
        import cache_info_adapter
    return cache_info_adapter


class AdapterCalls:
    def __init__(self, client, rank: int, scheduler: bool, plan: Plan, route: dict,
                 timeout: float) -> None:
        adapter = _import_adapter()
        if route["protocol"] != "ipc":
            raise ValueError("--adapter: the original's cache_info names ipc and rdma peers")
        self.adapter = adapter.CacheInfoAdapter(client, mode="per_chunk",
                                                ipc_peer=route["decode_instance"], timeout=timeout)
        self.finished_status = adapter.FINISHED
        self.rank, self.scheduler, self.plan, self.route = rank, scheduler, plan, route
        self.timeout = timeout
        self.finished: list = []

    def enter_slots(self, entering: list) -> None:
        infos = []
        for c in entering:
            req = self.plan.requests[c.request]
            infos.append({"request_id": req.id, "src_block_ids": self.plan.src_tables[c.request],
                          "current_id": c.slot, "need_prefill_tokens": len(req.prompt)})
        if self.scheduler:
            self.adapter.put_cache_info(infos)
        else:
            self.adapter.seen_cache_info(infos)  # this rank's messager read the same dictionaries

    def submit_dest(self, r: int, blocks: list[int], nonce: int) -> None:
        cached = len(self.plan.src_tables[r]) - len(blocks)
        self.adapter.put_cache_info([{
            "request_id": self.plan.requests[r].id,
            "dest_block_ids": [-1] * cached + list(blocks),
            "transfer_protocol": "ipc", "ip": "127.0.0.1",
            "device_ids": self.route["device_ids"],
            "request_nonce": nonce,
        }])

    def start_step(self, number: int, step: list) -> None:
        pass  # the adapter sends the step's batch with layer 0's signal

    def layer_done(self, number: int, layer: int, step: list) -> None:
        data = [len(step), layer]
        for c in step:
            data += [c.slot, c.offset, c.length]
        self.adapter.kv_signal(self.rank, number, data)

    def next_completion(self) -> tuple:
        while not self.finished:
            got = self.adapter.get_finished_req(timeout=self.timeout)
            if not got:
                raise TimeoutError(f"no request finished within {self.timeout} s")
            self.finished += got
        request_id, status = self.finished.pop(0)
        # The original's statuses: "finished", or "write cache error".
        ok = status == self.finished_status
        return ("prefill", request_id, "finished" if ok else "failed", "" if ok else status, 0)


def make_calls(adapter: bool, *args) -> "DirectCalls | AdapterCalls":
    return AdapterCalls(*args) if adapter else DirectCalls(*args)

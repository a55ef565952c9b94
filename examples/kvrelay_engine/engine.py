"""The engine's ranks: one process per tensor-parallel rank, all-reducing
with torch.distributed (gloo), and the oracle.

- A prefill rank runs the plan's chunked-prefill steps over its kvrelay pool
  (the pool's memory is its KV cache) and tells kvrelay that a layer is done
  right after its forward finishes that layer, for the whole step's batch
  (push_batch, then push_layer_done), where FastDeploy calls its messager.
  Rank 0 is also the scheduler: it submits each request's CacheTask when the
  request enters a slot, and its CacheDest when the decode side has given
  its blocks (some only after their prefill ended: late decode halves); then
  it reads one completion per request.
- A decode rank's rank 0 is the scheduler: it declares every request to
  kvrelay (expect_arrival, naming the prefill instance, with a nonce) with
  the blocks its prefix cache lacks, hands those to the prefill scheduler,
  and starts decoding a request when its `arrived` completion comes (and
  those of the requests whose prefix blocks it reuses). The other ranks
  follow its broadcasts.
- The oracle runs the same model in this process at TP 1, with a local
  cache of the same dtype and no kvrelay: what the tokens must be.
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

from .mla import MlaConfig, MlaModel
from .model import Model
from .prefill_calls import make_calls
from .schedule import Plan
from .stored import tolerance

STEP_TIMEOUT_S = 60.0


def make_model(cfg, rank: int, tp: int):
    """The GQA model (model.py) or the MLA one (mla.py), by its config."""
    return MlaModel(cfg, rank, tp) if isinstance(cfg, MlaConfig) else Model(cfg, rank, tp)


def init_group(rank: int, tp: int, port: int) -> None:
    torch.set_num_threads(1)  # ranks share the machine's cores
    if tp > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=tp)


def end_group(tp: int) -> None:
    if tp > 1:
        dist.barrier()  # no rank's pool goes before the others are done with theirs
        dist.destroy_process_group()


def prefill_step(model, cache, plan: Plan, step: list, on_layer=None) -> dict[int, int]:
    """One step of the plan, layer by layer over its batch; returns the first
    generated token of each request whose prompt this step finished."""
    h = {c.request: model.embed_tokens(plan.requests[c.request].prompt[c.offset:c.offset + c.length])
         for c in step}
    for l in range(model.cfg.layers):
        for c in step:
            h[c.request] = model.layer(l, h[c.request], c.offset, cache, plan.src_tables[c.request])
        if on_layer is not None:
            on_layer(l)
    return {c.request: model.next_token(h[c.request][-1])
            for c in step if c.offset + c.length == len(plan.requests[c.request].prompt)}


def decode(model, cache, table: list[int], prompt_len: int, first: int,
           gen_tokens: int, first_step_waits=None) -> tuple[list[int], torch.Tensor]:
    """Greedy decoding from the first token, one token at a time; returns the
    tokens and every decode step's logits, [gen_tokens - 1, vocab].
    first_step_waits(layer), if given, runs before each layer of the first
    step: the wait for a swap-in's layer."""
    tokens, logits = [first], []
    for i in range(gen_tokens - 1):
        h = model.embed_tokens([tokens[-1]])
        for l in range(model.cfg.layers):
            if i == 0 and first_step_waits is not None:
                first_step_waits(l)
            h = model.layer(l, h, prompt_len + i, cache, table)
        logits.append(model.logits(h[-1]))
        tokens.append(int(torch.argmax(logits[-1]).item()))
    return tokens, torch.stack(logits)


# ---------------------------------------------------------------- the oracle

@dataclass
class Answer:
    tokens: list[int]
    logits: torch.Tensor  # [decode steps, vocab]


def oracle(cfg, plan: Plan, num_blocks: int):
    """The same model in this process (TP 1), its cache local tensors of the
    same dtype, without kvrelay. Returns the answers and the cache (the KV
    each decode rank must have received)."""
    torch.set_num_threads(1)
    model = make_model(cfg, 0, 1)
    cache = model.local_cache(num_blocks, plan.block_size)
    first: dict[int, int] = {}
    for step in plan.steps:
        first.update(prefill_step(model, cache, plan, step))
    out = {}
    for r, req in enumerate(plan.requests):
        tokens, logits = decode(model, cache, plan.ref_tables[r], len(req.prompt), first[r],
                                req.gen_tokens)
        out[req.id] = Answer(tokens, logits)
    return out, cache


def check_received(model, cache, expected, plan: Plan, r: int, rank: int) -> str:
    """What request `r` has on this decode rank against the oracle's cache,
    layer by layer: '' when every value is the oracle's to one rounding step
    of the cache dtype (stored.tolerance: the ranks' float64 sums may round
    the other way), else which request, layer, tensor and rank differ."""
    req = plan.requests[r]
    n = len(req.prompt)
    for l in range(model.cfg.layers):
        mine = cache.received(l, plan.dst_tables[r], n, 0, model.local_kv_heads)
        want = expected.received(l, plan.ref_tables[r], n, model.first_kv_head, model.local_kv_heads)
        for (what, got), (_, ref) in zip(mine, want):
            bad = (got - ref).abs() > tolerance(model.cfg.cache_dtype, ref)
            if bool(bad.any()):
                return (f"request {req.id} layer {l} {what} on decode rank {rank}: "
                        f"{int(bad.sum())} of {bad.numel()} values differ from the oracle's "
                        f"(max |diff| {float((got - ref).abs().max()):.3g})")
    return ""


# ---------------------------------------------------------------- prefill

def prefill_rank(rank: int, tp: int, port: int, cfg, plan: Plan, instance: str, route: dict,
                 dests, first_tokens, results, adapter: bool = False) -> None:
    import kvrelay  # after the start: each rank its own client

    init_group(rank, tp, port)
    model = make_model(cfg, rank, tp)
    client = kvrelay.Client(instance, timeout=30)
    client.own_signals(rank)
    cache = model.cache_over_pool(client.open_pool(rank))
    scheduler = rank == 0
    if scheduler:
        client.own_completions()
    # kvrelay's own API, or the FastDeploy-shaped adapter's (prefill_calls.py)
    calls = make_calls(adapter, client, rank, scheduler, plan, route, STEP_TIMEOUT_S)
    tasked: set[int] = set()
    prefilled: set[int] = set()
    waiting: dict[int, tuple] = {}   # the decode side's blocks, not yet submitted
    dest_sent: set[int] = set()
    layer_ns: list[int] = []

    def take_dests(block: bool) -> None:
        while len(dest_sent) + len(waiting) < len(plan.requests):
            try:
                r, blocks, nonce = dests.get(timeout=STEP_TIMEOUT_S if block else 0.0)
            except queue.Empty:
                return
            waiting[r] = (blocks, nonce)

    def submit_dests() -> None:
        for r in sorted(waiting):
            if plan.late_dest[r] and r not in prefilled:
                continue  # a late decode half: after its prefill ended
            blocks, nonce = waiting.pop(r)
            calls.submit_dest(r, blocks, nonce)
            dest_sent.add(r)

    for number, step in enumerate(plan.steps, start=1):
        entering = [c for c in step if c.request not in tasked]  # requests entering their slots
        calls.enter_slots(entering)
        tasked.update(c.request for c in entering)
        if scheduler:
            take_dests(block=False)
            submit_dests()
        calls.start_step(number, step)
        started = time.monotonic_ns()

        def layer_done(l: int) -> None:
            nonlocal started
            now = time.monotonic_ns()
            layer_ns.append(now - started)
            calls.layer_done(number, l, step)
            started = time.monotonic_ns()

        done = prefill_step(model, cache, plan, step, on_layer=layer_done)
        finished_ns = time.monotonic_ns()
        if scheduler:
            for r, token in done.items():
                prefilled.add(r)
                first_tokens.put((r, token, finished_ns))
    if scheduler:
        while len(dest_sent) < len(plan.requests):
            take_dests(block=True)
            submit_dests()
        for _ in plan.requests:
            results.put(calls.next_completion())
        layer_ns.sort()
        results.put(("layer_ns", layer_ns[len(layer_ns) // 2]))
    end_group(tp)
    client.close()


# ---------------------------------------------------------------- decode

def decode_rank(rank: int, tp: int, port: int, cfg, plan: Plan, instance: str,
                prefill_instance: str, dests, first_tokens, results, expected,
                run_timeout_s: float, plant: str = "") -> None:
    import kvrelay

    init_group(rank, tp, port)
    model = make_model(cfg, rank, tp)
    client = kvrelay.Client(instance, timeout=30)
    cache = model.cache_over_pool(client.open_pool(rank))
    scheduler = rank == 0
    n = len(plan.requests)
    if scheduler:
        client.own_completions()
        for r, req in enumerate(plan.requests):
            nonce = kvrelay.Client.random_nonce()
            client.expect_arrival(req.id, plan.sent_blocks[r], from_instance=prefill_instance,
                                  request_nonce=nonce)
            dests.put((r, plan.sent_blocks[r], nonce))
    arrived: dict[int, int] = {}      # request -> when its `arrived` came
    first: dict[int, tuple] = {}      # request -> (first token, when its prefill ended)
    decoded: set[int] = set()
    ids = {req.id: r for r, req in enumerate(plan.requests)}
    deadline = time.monotonic() + run_timeout_s

    def ready(r: int) -> bool:
        if r in decoded or r not in arrived or r not in first or not plan.donors[r] <= arrived.keys():
            return False
        # The swap-in goes last: its eviction takes the donor's blocks away.
        return plan.swap is None or r != plan.swap.request or len(decoded) == n - 1

    def next_event() -> "Optional[kvrelay.Completion]":
        """The next completion, or None once a first token came instead."""
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"decode: arrived {sorted(arrived)}, first tokens {sorted(first)}")
            c = client.poll()
            if c is not None:
                return c
            try:
                r, token, prefilled_ns = first_tokens.get(timeout=0.01)
                first[r] = (token, prefilled_ns)
                return None
            except queue.Empty:
                pass

    def next_completion() -> "kvrelay.Completion":
        while True:
            c = next_event()
            if c is not None:
                return c

    while len(decoded) < n:
        pick = torch.tensor([-1, 0], dtype=torch.long)
        if scheduler:
            while pick[0] < 0:
                picked = [r for r in range(n) if ready(r)]
                if picked:
                    pick = torch.tensor([picked[0], first[picked[0]][0]], dtype=torch.long)
                    break
                c = next_event()
                if c is None:
                    continue
                if c.kind != "arrived" or not c.ok:
                    raise RuntimeError(f"decode: {c.request_id}: {c.kind} {c.status}: {c.message}")
                arrived[ids[c.request_id]] = time.monotonic_ns()
        if tp > 1:
            dist.broadcast(pick, src=0)
        r = int(pick[0])
        req = plan.requests[r]
        waits = None
        if plan.swap is not None and r == plan.swap.request:
            waits = swap_in(client, model, plan, rank, tp, next_completion, plant)
        if plant:
            plant_bug(plant, cache, plan, r, rank, cfg)
        tokens, logits = decode(model, cache, plan.dst_tables[r], len(req.prompt), int(pick[1]),
                                req.gen_tokens, waits)
        # After the decode: a swap-in's prefix is on the device only once its
        # forward has waited for every layer. Decoding writes only the
        # generated tokens' places, not the prompt's.
        problem = check_received(model, cache, expected, plan, r, rank)
        decoded.add(r)
        results.put(("received", req.id, rank, problem))
        if scheduler:
            # As a numpy array, pickled by value: a torch tensor crosses the
            # queue as a descriptor that the parent fetches from this process
            # when it reads the result, which fails once this rank has exited.
            results.put(("decode", req.id, tokens, logits.numpy(), arrived[r] - first[r][1]))
            if waits is not None:
                c = next_completion()
                results.put(("swap", c.request_id, c.ok, c.message, waits.longest_ns))
    end_group(tp)
    client.close()


class LayerWaits:
    """The swap-in's forward: before each layer, wait until kvrelay has
    loaded that layer on this rank (Client.wait_layer)."""

    def __init__(self, client, load_id: str, rank: int) -> None:
        self.client, self.load_id, self.rank = client, load_id, rank
        self.longest_ns = 0

    def __call__(self, layer: int) -> None:
        t = time.monotonic_ns()
        self.client.wait_layer(self.load_id, layer, rank=self.rank, timeout=STEP_TIMEOUT_S)
        self.longest_ns = max(self.longest_ns, time.monotonic_ns() - t)


def swap_in(client, model, plan: Plan, rank: int, tp: int, next_completion,
            plant: str) -> LayerWaits:
    """--swap, before the swap-in request is decoded: the scheduler evicts
    the donor's prefix blocks to the host tier (every rank's), every rank
    then gives those device blocks to other use (here: overwrites them), and
    the scheduler loads them back into the request's own blocks. The
    request's forward waits on each layer (the returned LayerWaits).
    --plant lose-swap damages what rank 0's host tier holds (one block of
    layer 1) before the load, as a swap bug would."""
    swap, req = plan.swap, plan.requests[plan.swap.request]
    cache = model.cache_over_pool(client.open_pool(rank))
    if rank == 0:
        client.submit_swap(f"{req.id}-evict", "evict", swap.donor_blocks, swap.host_blocks)
        c = next_completion()
        if c.kind != "swap" or not c.ok:
            raise RuntimeError(f"decode: {c.request_id}: {c.kind} {c.status}: {c.message}")
    if tp > 1:
        dist.barrier()  # every rank's copy is in the host tier
    if plant == "lose-swap" and rank == 0:
        model.cache_over_pool(client.open_pool(rank, host_tier=True)).zero_blocks(
            1, swap.host_blocks[:1])
    for l in range(model.cfg.layers):
        cache.scribble(l, swap.donor_blocks)
    if tp > 1:
        dist.barrier()
    if rank == 0:
        client.submit_swap(f"{req.id}-load", "load", swap.blocks, swap.host_blocks)
    return LayerWaits(client, f"{req.id}-load", rank)


def plant_bug(plant: str, cache, plan: Plan, r: int, rank: int, cfg) -> None:
    """The planted bugs that the oracle must catch (--plant): on decode rank
    0, before request 0 is decoded, what kvrelay delivered is damaged as a
    transfer bug would damage it."""
    if r != 0 or rank != 0 or plant == "lose-swap":  # (that one in swap_in)
        return
    blocks = plan.sent_blocks[0]
    if plant == "drop-block":   # one block of one layer never arrived
        cache.zero_blocks(1, blocks[:1])
    elif plant == "swap-heads":  # two KV heads written into each other's place
        cache.swap_heads(blocks)
    elif plant == "zero-request":  # everything the request received
        for l in range(cfg.layers):
            cache.zero_blocks(l, blocks)

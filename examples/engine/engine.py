"""The engine's ranks: one process per tensor-parallel rank, all-reducing
with torch.distributed (gloo).

- A prefill rank runs the plan's chunked-prefill steps over its kvrelay pool
  (the pool's memory is its KV cache) and tells kvrelay that a layer is done
  right after its forward finishes that layer, for the whole step's batch
  (push_batch, then push_layer_done), where FastDeploy calls its messager.
  Rank 0 is also the scheduler: it submits each request's CacheTask when the
  request enters a slot, and its CacheDest when the decode side has given
  its blocks; then it reads one completion per request.
- A decode rank declares nothing itself; its rank 0 is the scheduler: it
  allocates blocks (the plan's, with the prefix cache), declares every
  request to kvrelay (expect_arrival, naming the prefill instance and a
  nonce), hands the blocks to the prefill scheduler, and starts decoding a
  request when its `arrived` completion comes (and those of the requests
  whose prefix blocks it reuses). The other ranks follow its broadcasts.
- The reference ranks run the same plan with local tensors as the cache,
  prefill and decode in one instance: what the tokens must be.
"""

from __future__ import annotations

import os
import queue
import time

import torch
import torch.distributed as dist

from mla import MlaConfig, MlaModel
from model import Model
from schedule import Plan

STEP_TIMEOUT_S = 60.0


def make_model(cfg, rank: int, tp: int):
    """The GQA model (model.py) or the MLA one (mla.py), by its config."""
    return MlaModel(cfg, rank, tp) if isinstance(cfg, MlaConfig) else Model(cfg, rank, tp)


def init_group(rank: int, tp: int, port: int) -> None:
    torch.set_num_threads(1)  # ranks share the machine's cores
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=tp)


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
           gen_tokens: int) -> list[int]:
    """Greedy decoding from the first token, one token at a time."""
    tokens = [first]
    for i in range(gen_tokens - 1):
        h = model.embed_tokens([tokens[-1]])
        for l in range(model.cfg.layers):
            h = model.layer(l, h, prompt_len + i, cache, table)
        tokens.append(model.next_token(h[-1]))
    return tokens


# ---------------------------------------------------------------- reference

def reference_rank(rank: int, tp: int, port: int, cfg, plan: Plan, num_blocks: int,
                   results) -> None:
    init_group(rank, tp, port)
    model = make_model(cfg, rank, tp)
    cache = model.local_cache(num_blocks, plan.block_size)
    first: dict[int, int] = {}
    for step in plan.steps:
        first.update(prefill_step(model, cache, plan, step))
    for r, req in enumerate(plan.requests):
        tokens = decode(model, cache, plan.ref_tables[r], len(req.prompt), first[r], req.gen_tokens)
        if rank == 0:
            results.put(("reference", req.id, tokens))
    dist.destroy_process_group()


# ---------------------------------------------------------------- prefill

def prefill_rank(rank: int, tp: int, port: int, cfg, plan: Plan, instance: str,
                 decode_instance: str, dests, first_tokens, results) -> None:
    import kvrelay  # after the fork: each rank its own client

    init_group(rank, tp, port)
    model = make_model(cfg, rank, tp)
    client = kvrelay.Client(instance, timeout=30)
    client.own_signals(rank)
    cache = model.cache_over_pool(client.open_pool(rank))
    scheduler = rank == 0
    if scheduler:
        client.own_completions()
    tasked: set[int] = set()
    dest_sent: set[int] = set()

    def submit_ready_dests(block: bool) -> None:
        # The decode side's blocks for each request, as they come.
        while len(dest_sent) < len(plan.requests):
            try:
                r, blocks, nonce = dests.get(timeout=STEP_TIMEOUT_S if block else 0.0)
            except queue.Empty:
                return
            client.submit_cache_dest(plan.requests[r].id, blocks, peer_instance=decode_instance,
                                     device_ids=list(range(tp)), request_nonce=nonce)
            dest_sent.add(r)

    for number, step in enumerate(plan.steps, start=1):
        if scheduler:
            for c in step:
                if c.request not in tasked:  # the request enters its slot now
                    req = plan.requests[c.request]
                    client.submit_cache_task(req.id, plan.src_tables[c.request], len(req.prompt),
                                             engine_slot=c.slot)
                    tasked.add(c.request)
            submit_ready_dests(block=False)
        batch = [(c.slot, c.offset, c.length, plan.requests[c.request].id) for c in step]
        client.push_batch(rank, number, batch)
        done = prefill_step(model, cache, plan, step,
                            on_layer=lambda l: client.push_layer_done(rank, number, l))
        if scheduler:
            for r, token in done.items():
                first_tokens.put((r, token))
    if scheduler:
        submit_ready_dests(block=True)
        for _ in plan.requests:
            c = client.wait(timeout=STEP_TIMEOUT_S)
            results.put(("prefill", c.request_id, c.status, c.message, c.bytes_moved))
    dist.barrier()  # no rank's pool goes before the transfers out of it ended
    client.close()
    dist.destroy_process_group()


# ---------------------------------------------------------------- decode

def decode_rank(rank: int, tp: int, port: int, cfg, plan: Plan, instance: str,
                prefill_instance: str, dests, first_tokens, results, corrupt: bool = False) -> None:
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
    arrived: set[int] = set()
    first: dict[int, int] = {}
    decoded: set[int] = set()
    ids = {req.id: r for r, req in enumerate(plan.requests)}
    deadline = time.monotonic() + STEP_TIMEOUT_S * 2
    while len(decoded) < n:
        pick = torch.tensor([-1, 0], dtype=torch.long)
        if scheduler:
            while pick[0] < 0:
                ready = [r for r in range(n) if r not in decoded and r in arrived and r in first
                         and plan.donors[r] <= arrived]
                if ready:
                    pick = torch.tensor([ready[0], first[ready[0]]], dtype=torch.long)
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"decode: arrived {sorted(arrived)}, first tokens {sorted(first)}")
                c = client.poll()
                if c is not None:
                    if c.kind != "arrived" or not c.ok:
                        raise RuntimeError(f"decode: {c.request_id}: {c.kind} {c.status}: {c.message}")
                    arrived.add(ids[c.request_id])
                    continue
                try:
                    r, token = first_tokens.get(timeout=0.01)
                    first[r] = token
                except queue.Empty:
                    pass
        dist.broadcast(pick, src=0)
        r = int(pick[0])
        req = plan.requests[r]
        if corrupt and r == 0:
            # The negative control (run.py --corrupt): what request 0 received
            # zeroed on every rank (its V; an MLA latent), as if a transfer had lost it.
            for l in range(cfg.layers):
                cache.zero_blocks(l, plan.sent_blocks[0])
        tokens = decode(model, cache, plan.dst_tables[r], len(req.prompt), int(pick[1]),
                        req.gen_tokens)
        decoded.add(r)
        if scheduler:
            results.put(("decode", req.id, tokens))
    dist.barrier()
    client.close()
    dist.destroy_process_group()

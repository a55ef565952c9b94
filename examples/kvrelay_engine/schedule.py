"""What the engines will do, decided up front and identically in every rank:
the requests (prompts drawn from a seed, some sharing a prefix), the prefill
instance's chunked-prefill steps, and the block tables of both sides,
including the decode side's prefix cache.

Every rank of an instance computes the same plan from the same inputs, as
the ranks of a real engine follow one scheduler's decisions.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Optional


@dataclass
class Request:
    id: str
    prompt: list[int]
    gen_tokens: int


@dataclass
class Chunk:
    request: int      # index into the request list
    slot: int         # the engine slot it prefills in
    offset: int       # first prompt token of the chunk
    length: int


@dataclass
class Plan:
    requests: list[Request]
    block_size: int
    steps: list[list[Chunk]]                      # prefill steps, in order
    src_tables: list[list[int]]                   # prefill blocks of each prompt
    ref_tables: list[list[int]]                   # the reference's: prompt + generated
    dst_tables: list[list[int]] = field(default_factory=list)   # decode blocks, prompt + generated
    sent_blocks: list[list[int]] = field(default_factory=list)  # the decode blocks that are sent
    donors: list[set[int]] = field(default_factory=list)        # requests whose blocks it reuses
    late_dest: list[bool] = field(default_factory=list)         # decode half after prefill ended
    swap: Optional["SwapIn"] = None                             # --swap: the decode side's swap-in


@dataclass
class SwapIn:
    """--swap: the decode side's prefix cache evicts a donor's prefix blocks
    to the host tier once every other request is decoded (their device
    blocks go to other use), and the last request that shares the prefix
    loads them back into blocks of its own, layer by layer, its first
    forward waiting on each layer."""
    request: int               # the request that loads the prefix back
    donor_blocks: list[int]    # the decode blocks evicted
    host_blocks: list[int]     # where they wait in the host tier
    blocks: list[int]          # where the load puts them: the request's own

    def chunks_of(self, r: int) -> list[Chunk]:
        return [c for step in self.steps for c in step if c.request == r]


def make_requests(seed: int, count: int, vocab: int, block_size: int, gen_tokens: int) -> list[Request]:
    """`count` prompts of 20-150 tokens (several chunks each); every third
    shares the first two full blocks of the first prompt (the decode side's
    prefix cache gets hits)."""
    rng = random.Random(seed)
    requests: list[Request] = []
    for i in range(count):
        length = rng.randint(20, 150)
        prompt = [rng.randrange(vocab) for _ in range(length)]
        if i % 3 == 2 and requests:
            shared = requests[0].prompt[: 2 * block_size]
            prompt = shared + prompt[len(shared):] if length > len(shared) else shared + prompt[:8]
        requests.append(Request(f"req-{seed}-{i}", prompt, gen_tokens))
    return requests


def plan(requests: list[Request], block_size: int, slots: int, chunk_tokens: int,
         decode_blocks: int, swap: bool = False) -> Plan:
    # Prefill: requests take free slots in order; each active one prefills up
    # to chunk_tokens a step (chunked prefill); a finished one frees its slot.
    steps: list[list[Chunk]] = []
    waiting = list(range(len(requests)))
    active: dict[int, int] = {}   # slot -> request
    done = [0] * len(requests)
    while waiting or active:
        for slot in range(slots):
            if slot not in active and waiting:
                active[slot] = waiting.pop(0)
        step = []
        for slot, r in sorted(active.items()):
            n = min(chunk_tokens, len(requests[r].prompt) - done[r])
            step.append(Chunk(r, slot, done[r], n))
            done[r] += n
        steps.append(step)
        active = {s: r for s, r in active.items() if done[r] < len(requests[r].prompt)}

    def blocks_for(tokens: int) -> int:
        return (tokens + block_size - 1) // block_size

    src_tables, next_src = [], 0
    for req in requests:
        n = blocks_for(len(req.prompt))
        src_tables.append(list(range(next_src, next_src + n)))
        next_src += n
    # The reference prefills into the same blocks and decodes on in blocks
    # of its own after them.
    ref_tables, next_ref = [], next_src
    for req, src in zip(requests, src_tables):
        extra = blocks_for(len(req.prompt) + req.gen_tokens) - len(src)
        ref_tables.append(src + list(range(next_ref, next_ref + extra)))
        next_ref += extra

    # Decode: full prompt blocks are keyed by their whole token prefix; a
    # later request whose leading full blocks match reuses them and is sent
    # only the rest. The last, partial block and the generated tokens' blocks
    # are its own (generated tokens are written into them).
    p = Plan(requests, block_size, steps, src_tables, ref_tables)
    cached: dict[tuple[int, ...], tuple[int, int]] = {}  # prefix tokens -> (block, owner)
    next_dst = 0
    swapper = -1
    if swap:  # the last request that shares the first request's leading full block
        shared = [i for i, req in enumerate(requests) if i > 0 and len(requests[0].prompt) >= block_size
                  and req.prompt[:block_size] == requests[0].prompt[:block_size]]
        if not shared:
            raise ValueError("--swap: no request shares a prefix with the first (more --requests)")
        swapper = shared[-1]
    for i, req in enumerate(requests):
        full = len(req.prompt) // block_size
        table: list[int] = []
        donors: set[int] = set()
        for b in range(full):
            hit = cached.get(tuple(req.prompt[: (b + 1) * block_size]))
            if hit is None:
                break
            table.append(hit[0])
            donors.add(hit[1])
        reused = len(table)
        total = blocks_for(len(req.prompt) + req.gen_tokens)
        table += list(range(next_dst, next_dst + total - reused))
        next_dst += total - reused
        if i == swapper:  # the prefix comes back from the host tier into blocks of its own
            fresh = list(range(next_dst, next_dst + reused))
            next_dst += reused
            p.swap = SwapIn(i, table[:reused], list(range(reused)), fresh)
            table[:reused] = fresh
        for b in range(reused, full):
            cached[tuple(req.prompt[: (b + 1) * block_size])] = (table[b], i)
        p.dst_tables.append(table)
        p.sent_blocks.append(table[reused: blocks_for(len(req.prompt))])
        p.donors.append(donors)
        p.late_dest.append(i % 4 == 1)
    assert max(next_ref, next_dst) <= decode_blocks, "pools too small for the plan"
    return p

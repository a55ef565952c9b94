"""A small Llama-style model (RMSNorm, RoPE, grouped-query attention, SwiGLU)
whose weights come from a fixed seed, split over tensor-parallel ranks the
way engines split it: q/k/v and gate/up by columns (each rank its heads),
o and down by rows, summed with an all-reduce.

Attention reads keys and values through block tables from a paged cache
laid out like a kvrelay pool: per layer, K and V of shape [num_blocks,
kv_heads, block_size, head_dim], stored in the instance's dtype. The cache is whatever
holds those tensors: a kvrelay pool seen in place, or local tensors for the
single-process reference.

Every computation is per request (never batched across requests), in
float64, so that a request's numbers do not depend on its batch or on how
the ranks split the sums: the oracle (one process, TP 1) and the engines at
any TP then agree to ~1e-12, and no near-tie can flip a token. Only the
cache is stored in the instance's dtype (bfloat16, float16 or fp8 with
scales), as an engine's is.

Fewer KV heads than ranks replicate them (GQA at TP 4 with 2 KV heads): rank
r then holds KV head r // (tp / kv_heads), as kvrelay's head layout has it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from .stored import COMPUTE, StoredTensor


@dataclass(frozen=True)
class Config:
    vocab: int = 512
    hidden: int = 512
    layers: int = 4
    heads: int = 8          # query heads
    kv_heads: int = 2       # grouped-query attention: 4 query heads per KV head
    head_dim: int = 64
    ffn: int = 1024
    rope_theta: float = 10000.0
    seed: int = 1234
    cache_dtype: str = "bfloat16"   # the instance's --dtype

    def kv_heads_per_rank(self, tp: int) -> int:
        return max(1, self.kv_heads // tp)

    def kvrelay_flags(self, tp: int) -> list[str]:
        """The instance's pool: K and V, each rank its share of the KV heads
        (one replicated head when there are fewer heads than ranks)."""
        return ["--kv-heads", str(self.kv_heads_per_rank(tp)), "--total-kv-heads",
                str(self.kv_heads), "--head-dim", str(self.head_dim)]


DTYPE = COMPUTE  # every computation; the cache is the instance's dtype (stored.py)


def _weight(gen: torch.Generator, rows: int, cols: int) -> torch.Tensor:
    return torch.randn(rows, cols, generator=gen, dtype=DTYPE) / (rows ** 0.5)


class Model:
    """Rank `rank` of `tp`'s share of the model. All weights are drawn whole
    from the seed, then sliced: every TP size serves the same model."""

    def __init__(self, cfg: Config, rank: int, tp: int) -> None:
        assert cfg.heads % tp == 0 and cfg.ffn % tp == 0
        assert cfg.kv_heads % tp == 0 or tp % cfg.kv_heads == 0
        self.cfg, self.rank, self.tp = cfg, rank, tp
        gen = torch.Generator().manual_seed(cfg.seed)
        hd = cfg.head_dim
        self.q_heads = cfg.heads // tp
        self.local_kv_heads = cfg.kv_heads_per_rank(tp)
        first_kv = rank * self.local_kv_heads if tp <= cfg.kv_heads else rank // (tp // cfg.kv_heads)
        self.first_kv_head = first_kv
        self.embed = torch.randn(cfg.vocab, cfg.hidden, generator=gen, dtype=DTYPE)
        self.layers = []
        for _ in range(cfg.layers):
            wq = _weight(gen, cfg.hidden, cfg.heads * hd)
            wk = _weight(gen, cfg.hidden, cfg.kv_heads * hd)
            wv = _weight(gen, cfg.hidden, cfg.kv_heads * hd)
            wo = _weight(gen, cfg.heads * hd, cfg.hidden)
            wg = _weight(gen, cfg.hidden, cfg.ffn)
            wu = _weight(gen, cfg.hidden, cfg.ffn)
            wd = _weight(gen, cfg.ffn, cfg.hidden)
            q = slice(rank * self.q_heads * hd, (rank + 1) * self.q_heads * hd)
            kv = slice(first_kv * hd, (first_kv + self.local_kv_heads) * hd)
            f = slice(rank * cfg.ffn // tp, (rank + 1) * cfg.ffn // tp)
            self.layers.append({
                "attn_norm": torch.ones(cfg.hidden, dtype=DTYPE),
                "mlp_norm": torch.ones(cfg.hidden, dtype=DTYPE),
                "wq": wq[:, q].contiguous(), "wk": wk[:, kv].contiguous(),
                "wv": wv[:, kv].contiguous(), "wo": wo[q, :].contiguous(),
                "wg": wg[:, f].contiguous(), "wu": wu[:, f].contiguous(),
                "wd": wd[f, :].contiguous(),
            })
        self.final_norm = torch.ones(cfg.hidden, dtype=DTYPE)
        self.lm_head = _weight(gen, cfg.hidden, cfg.vocab)
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=DTYPE) / hd))
        self.inv_freq = inv

    # The cache: the kvrelay pool's memory in place, or local tensors.
    def cache_over_pool(self, pool) -> "PagedCache":
        return PagedCache.over_pool(pool, self.cfg.layers)

    def local_cache(self, num_blocks: int, block_size: int) -> "PagedCache":
        return PagedCache.local(self.cfg, self.tp, num_blocks, block_size)

    # ---- pieces ----
    @staticmethod
    def _rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # x: [tokens, heads, head_dim]; rotate pairs (half-split convention).
        angles = positions.to(DTYPE)[:, None] * self.inv_freq[None, :]
        cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)

    def _all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp > 1:
            dist.all_reduce(x)
        return x

    # ---- the forward, one layer of one request's tokens at a time ----
    def embed_tokens(self, tokens: list[int]) -> torch.Tensor:
        return self.embed[torch.tensor(tokens, dtype=torch.long)].clone()

    def layer(self, l: int, h: torch.Tensor, start: int, cache: "PagedCache",
              table: list[int]) -> torch.Tensor:
        """Layer `l` for tokens at positions [start, start + len(h)) of one
        request whose blocks are `table`: writes their K and V into the cache,
        attends over every position up to each token, returns the new h."""
        cfg, hd, w = self.cfg, self.cfg.head_dim, self.layers[l]
        n = h.shape[0]
        positions = torch.arange(start, start + n)
        a = self._rmsnorm(h, w["attn_norm"])
        q = self._rope((a @ w["wq"]).view(n, self.q_heads, hd), positions)
        k = self._rope((a @ w["wk"]).view(n, self.local_kv_heads, hd), positions)
        v = (a @ w["wv"]).view(n, self.local_kv_heads, hd)
        cache.write(l, table, start, k, v)
        keys, values = cache.read(l, table, start + n)  # [T, kv_heads, hd], float64
        group = self.q_heads // self.local_kv_heads
        keys = keys.repeat_interleave(group, dim=1)
        values = values.repeat_interleave(group, dim=1)
        scores = torch.einsum("nhd,thd->hnt", q, keys) / (hd ** 0.5)
        causal = positions[:, None] >= torch.arange(start + n)[None, :]
        scores = scores.masked_fill(~causal[None, :, :], float("-inf"))
        out = torch.einsum("hnt,thd->nhd", scores.softmax(-1), values).reshape(n, -1)
        h = h + self._all_reduce(out @ w["wo"])
        b = self._rmsnorm(h, w["mlp_norm"])
        act = torch.nn.functional.silu(b @ w["wg"]) * (b @ w["wu"])
        return h + self._all_reduce(act @ w["wd"])

    def logits(self, h_last: torch.Tensor) -> torch.Tensor:
        return self._rmsnorm(h_last, self.final_norm) @ self.lm_head

    def next_token(self, h_last: torch.Tensor) -> int:
        return int(torch.argmax(self.logits(h_last)).item())


class PagedCache:
    """K and V per layer, [num_blocks, kv_heads, block_size, head_dim] of the
    instance's dtype (stored.py; fp8 with its scales), read and written
    through a request's block table."""

    def __init__(self, k: list[StoredTensor], v: list[StoredTensor], block_size: int) -> None:
        self.k, self.v, self.block_size = k, v, block_size

    @staticmethod
    def local(cfg: Config, tp: int, num_blocks: int, block_size: int) -> "PagedCache":
        def make() -> list[StoredTensor]:
            return [StoredTensor.local(cfg.cache_dtype, num_blocks, cfg.kv_heads_per_rank(tp),
                                       block_size, cfg.head_dim) for _ in range(cfg.layers)]
        return PagedCache(make(), make(), block_size)

    @staticmethod
    def over_pool(pool, layers: int) -> "PagedCache":
        """The kvrelay pool's own memory as the cache: no copy anywhere."""
        return PagedCache([StoredTensor.over_pool(pool, l, "k") for l in range(layers)],
                          [StoredTensor.over_pool(pool, l, "v") for l in range(layers)],
                          pool.block_size)

    def _slots(self, table: list[int], start: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(start, start + n)
        blocks = torch.tensor(table, dtype=torch.long)[pos // self.block_size]
        return blocks, pos % self.block_size

    def write(self, layer: int, table: list[int], start: int, k: torch.Tensor,
              v: torch.Tensor) -> None:
        """k, v [tokens, heads, hd] into their blocks' [block, heads, offset, hd]."""
        blocks, offsets = self._slots(table, start, k.shape[0])
        self.k[layer].store(blocks, offsets, k)
        self.v[layer].store(blocks, offsets, v)

    def swap_heads(self, blocks: list[int]) -> None:
        """A planted bug: KV heads 0 and 1 of these blocks in each other's place."""
        for t in self.k + self.v:
            t.swap_heads(blocks, 0, 1)

    def received(self, layer: int, table: list[int], end: int, first_head: int,
                 heads: int) -> list[tuple[str, torch.Tensor]]:
        """K and V of tokens [0, end), heads [first_head, first_head + heads),
        as stored: what a decode rank compares with the oracle's."""
        k, v = self.read(layer, table, end)
        return [("K", k[:, first_head:first_head + heads]), ("V", v[:, first_head:first_head + heads])]

    def zero_blocks(self, layer: int, blocks: list[int]) -> None:
        """The negative control's damage: these blocks' V gone."""
        self.v[layer].zero(blocks)

    def scribble(self, layer: int, blocks: list[int]) -> None:
        """These blocks given to other use (after their eviction)."""
        self.k[layer].scribble(blocks)
        self.v[layer].scribble(blocks)

    def read(self, layer: int, table: list[int], end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of tokens [0, end) in float64, [tokens, heads, hd]."""
        blocks, offsets = self._slots(table, 0, end)
        return self.k[layer].load(blocks, offsets), self.v[layer].load(blocks, offsets)

"""A small DeepSeek-style model: multi-head latent attention (MLA) and a
SwiGLU MLP, weights from a fixed seed, split over tensor-parallel ranks.

Per token and layer, MLA caches one vector: the compressed latent c_kv
(kv_lora_rank values, RMS-normed) and the RoPE key k_pe shared by every
head (rope_dim values). Keys and values of each head are expanded from the
latent when attention reads it. The query heads are split over the ranks,
but every rank computes and caches the whole latent: the ranks hold copies,
not shares. That is a kvrelay K-only pool with one KV head in all
(`--k-only --total-kv-heads 1 --kv-heads 1 --head-dim kv_lora_rank +
rope_dim`), replicated on every rank of both instances.

As in model.py, every computation is per request and in float64, so the
tokens through kvrelay must equal the oracle's exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from .stored import COMPUTE, StoredTensor


@dataclass(frozen=True)
class MlaConfig:
    vocab: int = 512
    hidden: int = 512
    layers: int = 4
    heads: int = 8
    nope_dim: int = 64       # per head, without RoPE
    rope_dim: int = 32       # per head's RoPE part of q; k's is shared
    v_dim: int = 64
    kv_lora_rank: int = 128  # the latent
    ffn: int = 1024
    rope_theta: float = 10000.0
    seed: int = 4321
    cache_dtype: str = "bfloat16"   # the instance's --dtype

    @property
    def latent_dim(self) -> int:
        return self.kv_lora_rank + self.rope_dim

    def kvrelay_flags(self, tp: int) -> list[str]:
        return ["--k-only", "--kv-heads", "1", "--total-kv-heads", "1",
                "--head-dim", str(self.latent_dim)]


DTYPE = COMPUTE


def _weight(gen: torch.Generator, rows: int, cols: int) -> torch.Tensor:
    return torch.randn(rows, cols, generator=gen, dtype=DTYPE) / (rows ** 0.5)


def _rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


class LatentCache:
    """One tensor per layer, [num_blocks, 1, block_size, latent_dim] of the
    instance's dtype (stored.py; fp8 with one scale per token): a kvrelay
    K-only pool's layout."""

    def __init__(self, latents: list[StoredTensor], block_size: int) -> None:
        self.latents, self.block_size = latents, block_size

    def _slots(self, table: list[int], start: int, n: int):
        pos = torch.arange(start, start + n)
        return torch.tensor(table, dtype=torch.long)[pos // self.block_size], pos % self.block_size

    def write(self, layer: int, table: list[int], start: int, latent: torch.Tensor) -> None:
        blocks, offsets = self._slots(table, start, latent.shape[0])
        self.latents[layer].store(blocks, offsets, latent.unsqueeze(1))

    def read(self, layer: int, table: list[int], end: int) -> torch.Tensor:
        """[tokens, latent_dim] in float64."""
        blocks, offsets = self._slots(table, 0, end)
        return self.latents[layer].load(blocks, offsets).squeeze(1)

    def received(self, layer: int, table: list[int], end: int, first_head: int,
                 heads: int) -> list[tuple[str, torch.Tensor]]:
        """The latent of tokens [0, end): every rank holds it whole."""
        return [("latent", self.read(layer, table, end))]

    def swap_heads(self, blocks: list[int]) -> None:
        raise ValueError("an MLA cache has one head: there are no two to swap")

    def zero_blocks(self, layer: int, blocks: list[int]) -> None:
        self.latents[layer].zero(blocks)

    def scribble(self, layer: int, blocks: list[int]) -> None:
        """These blocks given to other use (after their eviction)."""
        self.latents[layer].scribble(blocks)


class MlaModel:
    def __init__(self, cfg: MlaConfig, rank: int, tp: int) -> None:
        assert cfg.heads % tp == 0 and cfg.ffn % tp == 0
        self.cfg, self.rank, self.tp = cfg, rank, tp
        gen = torch.Generator().manual_seed(cfg.seed)
        h = cfg.heads // tp
        self.local_heads = h
        self.first_kv_head, self.local_kv_heads = 0, 1  # the latent, on every rank
        heads = slice(rank * h, (rank + 1) * h)
        self.embed = torch.randn(cfg.vocab, cfg.hidden, generator=gen, dtype=DTYPE)
        self.layers = []
        for _ in range(cfg.layers):
            wq = _weight(gen, cfg.hidden, cfg.heads * (cfg.nope_dim + cfg.rope_dim))
            w_dkv = _weight(gen, cfg.hidden, cfg.kv_lora_rank)     # down to the latent
            w_kr = _weight(gen, cfg.hidden, cfg.rope_dim)          # the shared RoPE key
            w_uk = _weight(gen, cfg.kv_lora_rank, cfg.heads * cfg.nope_dim)
            w_uv = _weight(gen, cfg.kv_lora_rank, cfg.heads * cfg.v_dim)
            wo = _weight(gen, cfg.heads * cfg.v_dim, cfg.hidden)
            wg = _weight(gen, cfg.hidden, cfg.ffn)
            wu = _weight(gen, cfg.hidden, cfg.ffn)
            wd = _weight(gen, cfg.ffn, cfg.hidden)
            qd, nd, vd = cfg.nope_dim + cfg.rope_dim, cfg.nope_dim, cfg.v_dim
            f = slice(rank * cfg.ffn // tp, (rank + 1) * cfg.ffn // tp)
            self.layers.append({
                "attn_norm": torch.ones(cfg.hidden, dtype=DTYPE),
                "kv_norm": torch.ones(cfg.kv_lora_rank, dtype=DTYPE),
                "mlp_norm": torch.ones(cfg.hidden, dtype=DTYPE),
                "wq": wq.view(cfg.hidden, cfg.heads, qd)[:, heads].reshape(cfg.hidden, -1).contiguous(),
                "w_dkv": w_dkv, "w_kr": w_kr,  # every rank: the latent is replicated
                "w_uk": w_uk.view(-1, cfg.heads, nd)[:, heads].contiguous(),
                "w_uv": w_uv.view(-1, cfg.heads, vd)[:, heads].contiguous(),
                "wo": wo.view(cfg.heads, vd, cfg.hidden)[heads].reshape(-1, cfg.hidden).contiguous(),
                "wg": wg[:, f].contiguous(), "wu": wu[:, f].contiguous(), "wd": wd[f, :].contiguous(),
            })
        self.final_norm = torch.ones(cfg.hidden, dtype=DTYPE)
        self.lm_head = _weight(gen, cfg.hidden, cfg.vocab)
        self.inv_freq = 1.0 / (cfg.rope_theta ** (
            torch.arange(0, cfg.rope_dim, 2, dtype=DTYPE) / cfg.rope_dim))

    # The cache: the kvrelay pool's memory in place, or local tensors.
    def cache_over_pool(self, pool) -> LatentCache:
        assert pool.tensors in (["k"], ["k", "k_scale"]), pool.tensors
        return LatentCache([StoredTensor.over_pool(pool, l, "k") for l in range(self.cfg.layers)],
                           pool.block_size)

    def local_cache(self, num_blocks: int, block_size: int) -> LatentCache:
        return LatentCache([StoredTensor.local(self.cfg.cache_dtype, num_blocks, 1, block_size,
                                               self.cfg.latent_dim)
                            for _ in range(self.cfg.layers)], block_size)

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        angles = positions.to(DTYPE)[:, None] * self.inv_freq[None, :]
        cos, sin = angles.cos(), angles.sin()
        if x.dim() == 3:
            cos, sin = cos[:, None, :], sin[:, None, :]
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)

    def _all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp > 1:
            dist.all_reduce(x)
        return x

    def embed_tokens(self, tokens: list[int]) -> torch.Tensor:
        return self.embed[torch.tensor(tokens, dtype=torch.long)].clone()

    def layer(self, l: int, h: torch.Tensor, start: int, cache: LatentCache,
              table: list[int]) -> torch.Tensor:
        cfg, w, n = self.cfg, self.layers[l], h.shape[0]
        positions = torch.arange(start, start + n)
        a = _rmsnorm(h, w["attn_norm"])
        q = (a @ w["wq"]).view(n, self.local_heads, cfg.nope_dim + cfg.rope_dim)
        q_nope, q_pe = q[..., : cfg.nope_dim], self._rope(q[..., cfg.nope_dim:], positions)
        c_kv = _rmsnorm(a @ w["w_dkv"], w["kv_norm"])
        k_pe = self._rope(a @ w["w_kr"], positions)
        cache.write(l, table, start, torch.cat([c_kv, k_pe], dim=-1))
        latent = cache.read(l, table, start + n)                       # [T, latent_dim]
        c_all, pe_all = latent[:, : cfg.kv_lora_rank], latent[:, cfg.kv_lora_rank:]
        k_nope = torch.einsum("tc,chd->thd", c_all, w["w_uk"])          # [T, heads, nope]
        v = torch.einsum("tc,chd->thd", c_all, w["w_uv"])               # [T, heads, v_dim]
        scores = (torch.einsum("nhd,thd->hnt", q_nope, k_nope)
                  + torch.einsum("nhd,td->hnt", q_pe, pe_all)) / ((cfg.nope_dim + cfg.rope_dim) ** 0.5)
        causal = positions[:, None] >= torch.arange(start + n)[None, :]
        scores = scores.masked_fill(~causal[None, :, :], float("-inf"))
        out = torch.einsum("hnt,thd->nhd", scores.softmax(-1), v).reshape(n, -1)
        h = h + self._all_reduce(out @ w["wo"])
        b = _rmsnorm(h, w["mlp_norm"])
        act = torch.nn.functional.silu(b @ w["wg"]) * (b @ w["wu"])
        return h + self._all_reduce(act @ w["wd"])

    def logits(self, h_last: torch.Tensor) -> torch.Tensor:
        return _rmsnorm(h_last, self.final_norm) @ self.lm_head

    def next_token(self, h_last: torch.Tensor) -> int:
        return int(torch.argmax(self.logits(h_last)).item())

"""One KV-cache tensor of one layer as the engine stores it: [num_blocks,
heads, block_size, dim] of the instance's dtype, and for fp8 its float32
scales [num_blocks, heads, block_size] beside it (fp8.py). The model computes
in float64; only what the cache holds is rounded to its dtype.

The tensors are a kvrelay pool's own memory (over_pool) or local ones (the
oracle's cache): the same code reads and writes both.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import fp8

COMPUTE = torch.float64
STORAGE = {"bfloat16": torch.bfloat16, "float16": torch.float16, "fp8": torch.uint8}
# One rounding step of each dtype, relative to the value: what the ranks'
# float64 sums (split differently over TP) may rarely move a stored value by.
RELATIVE_STEP = {"bfloat16": 2.0 ** -7, "float16": 2.0 ** -10, "fp8": fp8.RELATIVE_STEP}


class StoredTensor:
    def __init__(self, data: torch.Tensor, scales: Optional[torch.Tensor]) -> None:
        self.data, self.scales = data, scales

    @staticmethod
    def local(dtype: str, num_blocks: int, heads: int, block_size: int, dim: int) -> "StoredTensor":
        data = torch.zeros((num_blocks, heads, block_size, dim), dtype=STORAGE[dtype])
        scales = (torch.zeros((num_blocks, heads, block_size), dtype=torch.float32)
                  if dtype == "fp8" else None)
        return StoredTensor(data, scales)

    @staticmethod
    def over_pool(pool, layer: int, tensor: str) -> "StoredTensor":
        """The pool's tensor `tensor` ('k' or 'v') of `layer` in place (no
        copy), with its scale tensor ('k_scale', 'v_scale') for fp8."""
        shape = (pool.num_blocks, pool.kv_heads, pool.block_size, pool.head_dim)
        data = torch.frombuffer(pool.tensor(layer, tensor), dtype=STORAGE[pool.dtype]).view(shape)
        scales = None
        if pool.dtype == "fp8":
            if f"{tensor}_scale" not in pool.tensors:
                raise ValueError("an fp8 pool without scales (--no-fp8-scales): this engine "
                                 "keeps a float32 scale per token and head")
            scales = torch.frombuffer(pool.tensor(layer, f"{tensor}_scale"),
                                      dtype=torch.float32).view(shape[:3])
        return StoredTensor(data, scales)

    def store(self, blocks: torch.Tensor, offsets: torch.Tensor, x: torch.Tensor) -> None:
        """x [tokens, heads, dim] into the tokens' (block, offset) places."""
        if self.scales is None:
            self.data[blocks, :, offsets, :] = x.to(self.data.dtype)
            return
        codes, scales = fp8.encode(x)
        self.data[blocks, :, offsets, :] = codes
        self.scales[blocks, :, offsets] = scales

    def load(self, blocks: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """[tokens, heads, dim] in float64."""
        if self.scales is None:
            return self.data[blocks, :, offsets, :].to(COMPUTE)
        return fp8.decode(self.data[blocks, :, offsets, :], self.scales[blocks, :, offsets])

    def zero(self, blocks: list[int]) -> None:
        self.data[blocks] = 0
        if self.scales is not None:
            self.scales[blocks] = 0

    def scribble(self, blocks: list[int]) -> None:
        """Other data in these blocks, as when they go to another request."""
        self.data[blocks] = 3
        if self.scales is not None:
            self.scales[blocks] = 3.0

    def swap_heads(self, blocks: list[int], a: int, b: int) -> None:
        for t in (self.data, self.scales):
            if t is not None:
                t[blocks, a], t[blocks, b] = t[blocks, b].clone(), t[blocks, a].clone()


def tolerance(dtype: str, ref: torch.Tensor) -> torch.Tensor:
    """How far a received value [tokens, heads, dim] may be from the
    oracle's: one rounding step of the dtype (for fp8 also the smallest
    subnormal at the vector's scale)."""
    tol = ref.abs() * RELATIVE_STEP[dtype] + 1e-30
    if dtype == "fp8":
        tol = tol + ref.abs().amax(-1, keepdim=True) / fp8.E4M3_MAX * fp8.SUBNORMAL_STEP
    return tol

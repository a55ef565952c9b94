"""fp8 (e4m3) KV caches with float32 scales, by hand: torch 1.13 has no fp8
type, so the cache stores the e4m3 bytes as uint8 and one float32 scale per
token and head, the layout of a kvrelay pool created with `--dtype fp8`
(K [num_blocks, heads, block_size, head_dim] of bytes and K scale
[num_blocks, heads, block_size] of float32; the same for V).

e4m3 here is the OCP "fn" variant that engines and FlashMLA use: 1 sign bit,
4 exponent bits (bias 7), 3 mantissa bits, no infinities, largest finite
value 448, 0x7f/0xff NaN. Each (token, head) vector is scaled so that its
largest magnitude maps to 448, then rounded to the nearest e4m3 value (ties
to even), as a cast to torch.float8_e4m3fn would round it.
"""

from __future__ import annotations

import torch

E4M3_MAX = 448.0


def _e4m3_table() -> torch.Tensor:
    """The value of each code 0..126 (non-negative, increasing); 127 is NaN."""
    values = []
    for code in range(127):
        exponent, mantissa = code >> 3, code & 7
        if exponent == 0:
            values.append(mantissa / 8 * 2.0 ** -6)            # subnormal
        else:
            values.append((1 + mantissa / 8) * 2.0 ** (exponent - 7))
    return torch.tensor(values, dtype=torch.float64)


_VALUES = _e4m3_table()
_MIDPOINTS = (_VALUES[:-1] + _VALUES[1:]) / 2


def encode(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., d] (float64) -> (codes [..., d] uint8, scales [...] float32)
    with x ~= decode(codes, scales)."""
    amax = x.abs().amax(-1)
    scale = (amax / E4M3_MAX).to(torch.float32)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero vector
    scaled = (x / scale.to(torch.float64).unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX)
    magnitude = scaled.abs()
    code = torch.bucketize(magnitude, _MIDPOINTS)  # a midpoint itself goes to the lower code
    tie = magnitude == _MIDPOINTS[code.clamp(max=len(_MIDPOINTS) - 1)]
    code = code + (tie & (code % 2 == 1)).long()   # ties to the even mantissa
    code = code | ((scaled < 0).long() << 7)
    return code.to(torch.uint8), scale


def decode(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(codes [..., d] uint8, scales [...] float32) -> float64 [..., d]."""
    c = codes.long()
    magnitude = _VALUES[(c & 0x7F).clamp(max=126)]
    value = torch.where(c >= 0x80, -magnitude, magnitude)
    return value * scales.to(torch.float64).unsqueeze(-1)


# One step of e4m3 relative to a value (3 mantissa bits), and the smallest
# subnormal relative to the vector's scale: what one rounding the other way
# moves a value by.
RELATIVE_STEP = 2.0 ** -3
SUBNORMAL_STEP = 2.0 ** -9

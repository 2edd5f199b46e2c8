"""Counter-based noise for sampling, keyed by (seed, position, token id).

The noise of one cell depends only on its key, never on the batch, the tile or the launch
order. A fused or chunked kernel that sees vocabulary ids [lo, hi) of a row therefore draws
exactly the noise that the reference draws for the same ids, so both sample the same token.

Hash (splitmix64, Steele et al. 2014, https://prng.di.unimi.it/splitmix64.c):

    row   = mix64(mix64(seed + GOLDEN) ^ (position * MIX2))
    h     = mix64(row + (token_id + 1) * GOLDEN)          # splitmix64's own stream step
    mix64(z): z ^= z >>> 30; z *= MIX1; z ^= z >>> 27; z *= MIX2; z ^= z >>> 31

All arithmetic is on 64-bit words modulo 2**64. torch has no uint64 arithmetic, so the words
live in int64: multiplication wraps in two's complement (the same bits as unsigned), and
`>>>` is an arithmetic shift followed by a mask that clears the sign-extended bits.

Conversions (a port must copy these too):
- `uniform_noise`: the top 23 bits k give (k + 0.5) / 2**23, exact in float32, inside (0, 1).
- `gumbel`: the top 52 bits k give (k + 0.5) / 2**52, exact in float64, inside (0, 1);
  -log(-log(u)) is taken in float64 and rounded to float32. The finer grid keeps the Gumbel
  tail (the noise that lets a rare token win over a large vocabulary) from being quantized at
  2**-23.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)

_MASK64 = (1 << 64) - 1


def _signed(x: int) -> int:
    # An unsigned 64-bit constant as the int64 with the same bits.
    x &= _MASK64
    return x - (1 << 64) if x >= 1 << 63 else x


GOLDEN = _signed(0x9E3779B97F4A7C15)
MIX1 = _signed(0xBF58476D1CE4E5B9)
MIX2 = _signed(0x94D049BB133111EB)


def _shr(z: torch.Tensor, s: int) -> torch.Tensor:
    # Logical right shift of int64 words: torch's >> sign-extends, so clear the top s bits.
    return (z >> s) & ((1 << (64 - s)) - 1)


def _mix64(z: torch.Tensor) -> torch.Tensor:
    z = (z ^ _shr(z, 30)) * MIX1
    z = (z ^ _shr(z, 27)) * MIX2
    return z ^ _shr(z, 31)


def _as_ids(token_ids: torch.Tensor | int, device: torch.device) -> torch.Tensor:
    if isinstance(token_ids, int):
        return torch.arange(token_ids, dtype=torch.int64, device=device)
    if token_ids.dim() != 1:
        raise ValueError(f"token_ids must be 1-D, got shape {tuple(token_ids.shape)}")
    return token_ids.to(device=device, dtype=torch.int64)


def hash_bits(
    seed: torch.Tensor, position: torch.Tensor, token_ids: torch.Tensor | int
) -> torch.Tensor:
    """64 random bits per cell as int64. seed, position: [b] int; token_ids: [V] or V -> [b, V]."""
    if seed.dim() != 1 or position.shape != seed.shape:
        raise ValueError(
            f"seed and position must both be [b], got {tuple(seed.shape)}, {tuple(position.shape)}"
        )
    seed = seed.to(torch.int64)
    ids = _as_ids(token_ids, seed.device)
    row = _mix64(_mix64(seed + GOLDEN) ^ (position.to(torch.int64) * MIX2))  # [b]
    return _mix64(row[:, None] + (ids[None, :] + 1) * GOLDEN)  # [b, V]


def uniform_noise(
    seed: torch.Tensor, position: torch.Tensor, token_ids: torch.Tensor | int
) -> torch.Tensor:
    """Uniforms in the open interval (0, 1) as float32 [b, V]."""
    k = _shr(hash_bits(seed, position, token_ids), 41)  # top 23 bits
    return ((k.to(torch.float64) + 0.5) * 2.0**-23).to(torch.float32)


def gumbel(
    seed: torch.Tensor, position: torch.Tensor, token_ids: torch.Tensor | int
) -> torch.Tensor:
    """Standard Gumbel noise -log(-log(u)) as float32 [b, V], from 52-bit uniforms."""
    k = _shr(hash_bits(seed, position, token_ids), 12)  # top 52 bits; k + 0.5 fits float64
    u = (k.to(torch.float64) + 0.5) * 2.0**-52
    return (-torch.log(-torch.log(u))).to(torch.float32)


def row_keys(seed: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """The per-row half of the hash, [b] int64: fused kernels take it as their input."""
    return _mix64(_mix64(seed.to(torch.int64) + GOLDEN) ^ (position.to(torch.int64) * MIX2))


def gumbel_at(seed: torch.Tensor, position: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """Gumbel noise at per-row ids [b, n] (e.g. top-k candidates) -> float32 [b, n]; the same
    values `gumbel` gives at those ids."""
    row = row_keys(seed, position)  # [b]
    k = _shr(_mix64(row[:, None] + (token_ids.to(torch.int64) + 1) * GOLDEN), 12)
    u = (k.to(torch.float64) + 0.5) * 2.0**-52
    return (-torch.log(-torch.log(u))).to(torch.float32)

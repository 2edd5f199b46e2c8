"""Weights stored as integer groups of 32 along K, the layouts GGUF's Q8_0, Q5_0 and Q4_K
blocks hold, kept without loss:

    w[n, k] = scales[n, k // 32] * q[n, k] + offsets[n, k // 32]

- bits 8 (Q8_0): q int8, `values` int8 [N, K];
- bits 5 (Q5_0): q in [-16, 15], `values` uint8 [N, K // 2] of nibbles and `high` uint8
  [N, K // 8] of fifth bits: q = nibble + 16 * bit - 16;
- bits 4 (Q4_K): q in [0, 15], `values` uint8 [N, K // 2] of nibbles.

Packed as the file packs them: per group, byte j holds value j in its low nibble and value
j + 16 in its high one, and the group's fifth bits are one little-endian 32-bit mask. Q8_0
and Q5_0 are symmetric (no offsets; `scales` is the file's own fp16 block scale); Q4_K is
asymmetric (`scales` = d·sc and `offsets` = −dmin·m, each exact in fp32). A decode step at one
client is a read of every weight, so it runs in the bytes it reads: a row of 640 values is
680 bytes in Q8_0, 440 in Q5_0 and 1280 in bf16.

Rows keep their order and groups run along a row, so a nested head's first V rows are the
first V rows here too (`rows`), and a row permutation (a Matryoshka reorder) permutes every
per-row tensor alike (`take`).

`product` multiplies through polyhead's AVX-512 GEMV (`torch.ops.polyhead.gemv_groups`, built
with the fused CPU ops) where it is loaded, else through the dequantised matrix (the
reference, for machines without the build).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

GROUP = 32  # values per scale, along K
BITS = (8, 5, 4)
_ZERO = {8: 0, 5: 16, 4: 0}  # stored unsigned value minus this is q
# tensor names in a safetensors file: <name>.int<bits>, .int_high, .int_scales, .int_offsets
_VALUES = {b: f".int{b}" for b in BITS}
_HIGH, _SCALES, _OFFSETS = ".int_high", ".int_scales", ".int_offsets"


@dataclass(frozen=True)
class IntGroups:
    values: torch.Tensor  # int8 [N, K] (bits 8), or uint8 [N, K // 2] nibbles (bits 5, 4)
    scales: torch.Tensor  # fp16 or fp32 [N, K // 32]
    offsets: torch.Tensor | None = None  # fp32 [N, K // 32]; None: symmetric
    bits: int = 8
    high: torch.Tensor | None = None  # uint8 [N, K // 8], bits 5 only

    def __post_init__(self) -> None:
        if self.bits not in BITS:
            raise ValueError(f"int groups: bits must be one of {BITS}")
        n, k = self.shape
        dtype = torch.int8 if self.bits == 8 else torch.uint8
        if self.values.dtype != dtype or self.values.dim() != 2 or k % GROUP:
            raise ValueError(f"int groups: {self.bits}-bit values must be {dtype} and K a "
                             f"multiple of {GROUP}")
        if tuple(self.scales.shape) != (n, k // GROUP) or self.scales.dtype not in (
                torch.float16, torch.float32):
            raise ValueError(f"int groups: scales must be fp16/fp32 [{n}, {k // GROUP}]")
        if self.offsets is not None and (self.offsets.shape != self.scales.shape
                                         or self.offsets.dtype != torch.float32):
            raise ValueError("int groups: offsets must be fp32, shaped as the scales")
        if (self.high is not None) != (self.bits == 5) or (self.high is not None and (
                self.high.dtype != torch.uint8 or tuple(self.high.shape) != (n, k // 8))):
            raise ValueError(f"int groups: 5 bits, and only 5, need high uint8 [{n}, {k // 8}]")

    @staticmethod
    def pack(q: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor | None = None,
             bits: int = 8) -> IntGroups:
        """Groups from q [N, K] (int8, each value within `bits`' range), packed."""
        if bits == 8:
            return IntGroups(q, scales, offsets)
        lo, hi = -_ZERO[bits], (1 << bits) - 1 - _ZERO[bits]
        if q.numel() and (int(q.min()) < lo or int(q.max()) > hi):
            raise ValueError(f"int groups: {bits}-bit values must lie in [{lo}, {hi}]")
        n, k = q.shape
        u = (q.to(torch.int16) + _ZERO[bits]).to(torch.uint8).view(n, k // GROUP, 2, 16)
        nibbles = (u[:, :, 0] & 15) | ((u[:, :, 1] & 15) << 4)  # [N, K/32, 16]
        high = None
        if bits == 5:
            fifth = ((u >> 4) & 1).view(n, k // GROUP, 4, 8)  # value j -> byte j // 8, bit j % 8
            weights = torch.tensor([1 << i for i in range(8)], dtype=torch.uint8)
            high = (fifth * weights).sum(-1, dtype=torch.uint8).view(n, k // 8)
        return IntGroups(nibbles.reshape(n, k // 2).contiguous(), scales, offsets, bits, high)

    @property
    def shape(self) -> tuple[int, int]:
        n, cols = int(self.values.shape[0]), int(self.values.shape[1])
        return (n, cols if self.bits == 8 else 2 * cols)

    @property
    def nbytes(self) -> int:
        """Bytes one product reads."""
        extra = sum(t.nbytes for t in (self.offsets, self.high) if t is not None)
        return self.values.nbytes + self.scales.nbytes + extra

    def q(self) -> torch.Tensor:
        """The integers q, int8 [N, K]."""
        if self.bits == 8:
            return self.values
        n, k = self.shape
        v = self.values.view(n, k // GROUP, 1, 16)
        u = torch.cat([v & 15, v >> 4], dim=2).view(n, k).to(torch.int16)
        if self.high is not None:
            shifts = torch.arange(8, dtype=torch.uint8)
            fifth = ((self.high.view(n, k // 8, 1) >> shifts) & 1).view(n, k)
            u = u + 16 * fifth.to(torch.int16)
        return (u - _ZERO[self.bits]).to(torch.int8)

    def map_rows(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> IntGroups:
        """Every per-row tensor through `fn` (a row slice, gather or permutation)."""
        return IntGroups(fn(self.values), fn(self.scales),
                         None if self.offsets is None else fn(self.offsets), self.bits,
                         None if self.high is None else fn(self.high))

    def rows(self, lo: int, hi: int) -> IntGroups:
        """Rows [lo, hi), as views."""
        return self.map_rows(lambda t: t[lo:hi])

    def take(self, index: torch.Tensor) -> IntGroups:
        """Rows in the order `index` [N'] gives (copies)."""
        return self.map_rows(lambda t: t[index])

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        # -> [N, K], exact in fp32
        n, k = self.shape
        w = self.q().float().view(n, k // GROUP, GROUP) * self.scales.float()[..., None]
        if self.offsets is not None:
            w = w + self.offsets[..., None]
        return w.view(n, k).to(dtype)

    def contiguous(self) -> IntGroups:
        return self.map_rows(lambda t: t.contiguous())

    def product(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """x [B, K] -> x @ W.T [B, N] in x's dtype (fp32 sums). The closure holds contiguous
        copies where these are views of non-contiguous rows."""
        me = self.contiguous()
        if not gemv_available():
            weight = me.dequantize()
            return lambda x: (x.float() @ weight.T).to(x.dtype)
        empty = torch.empty(0, dtype=torch.uint8)
        offsets = torch.empty(0) if me.offsets is None else me.offsets
        high = empty if me.high is None else me.high
        gemv, bits = torch.ops.polyhead.gemv_groups, me.bits
        return lambda x: gemv(x, me.values, high, me.scales, offsets, bits)

    def to_tensors(self, name: str) -> dict[str, torch.Tensor]:
        out = {name + _VALUES[self.bits]: self.values, name + _SCALES: self.scales}
        if self.offsets is not None:
            out[name + _OFFSETS] = self.offsets
        if self.high is not None:
            out[name + _HIGH] = self.high
        return out

    @staticmethod
    def from_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, IntGroups]:
        """Every group set that `to_tensors` wrote, by name."""
        out = {}
        for key in tensors:
            for bits, suffix in _VALUES.items():
                if key.endswith(suffix):
                    n = key.removesuffix(suffix)
                    out[n] = IntGroups(tensors[key], tensors[n + _SCALES],
                                       tensors.get(n + _OFFSETS), bits, tensors.get(n + _HIGH))
        return out

    @staticmethod
    def cat(parts: list[IntGroups]) -> IntGroups:
        """Parts stacked along N (fused projections of one input). Parts of different widths
        are widened to int8; scales widen to fp32 when the parts differ, and a symmetric part
        gets zero offsets beside an asymmetric one."""
        if len({p.shape[1] for p in parts}) != 1:
            raise ValueError("int groups: parts to stack must share K")
        if len({p.bits for p in parts}) != 1:
            parts = [IntGroups(p.q(), p.scales, p.offsets) for p in parts]
        dtype = parts[0].scales.dtype if len({p.scales.dtype for p in parts}) == 1 \
            else torch.float32
        values = torch.cat([p.values for p in parts])
        scales = torch.cat([p.scales.to(dtype) for p in parts])
        high = None if parts[0].high is None else torch.cat([p.high for p in parts
                                                              if p.high is not None])
        offsets = None
        if any(p.offsets is not None for p in parts):
            offsets = torch.cat([torch.zeros(p.scales.shape) if p.offsets is None else p.offsets
                                 for p in parts])
        return IntGroups(values, scales, offsets, parts[0].bits, high)


def gemv_available() -> bool:
    """Whether polyhead's fused CPU ops are loaded with the groups' GEMV (AVX512-BW builds)."""
    return hasattr(torch.ops.polyhead, "gemv_groups")

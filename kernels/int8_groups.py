"""Weights stored as int8 groups of 32 along K, the layout GGUF's Q8_0, Q5_0 and Q4_K blocks
dequantise to without loss:

    w[n, k] = scales[n, k // 32] * values[n, k] + offsets[n, k // 32]

Q8_0 and Q5_0 are symmetric (no offsets; `scales` is the file's own fp16 block scale); Q4_K
is asymmetric (`scales` = d·sc and `offsets` = −dmin·m, each exact in fp32). A decode step at
one client is a read of every weight, so it runs in the bytes it reads: a Q8_0 row of 640
values is 680 bytes, in bf16 1280.

Rows keep their order and groups run along a row, so a nested head's first V rows are the
first V rows here too (`rows`), and a row permutation (a Matryoshka reorder) permutes
values, scales and offsets alike (`take`).

`product` multiplies through polyhead's AVX-512 GEMV (`torch.ops.polyhead.gemv_int8`, built
with the fused CPU ops) where it is loaded, else through the dequantised matrix (the
reference, for machines without the build).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

GROUP = 32  # values per scale, along K
SUFFIXES = (".int8", ".int8_scales", ".int8_offsets")  # tensor names in a safetensors file


@dataclass(frozen=True)
class Int8Groups:
    values: torch.Tensor  # int8 [N, K]
    scales: torch.Tensor  # fp16 or fp32 [N, K // 32]
    offsets: torch.Tensor | None = None  # fp32 [N, K // 32]; None: symmetric

    def __post_init__(self) -> None:
        n, k = self.values.shape
        if self.values.dtype != torch.int8 or k % GROUP:
            raise ValueError(f"int8 groups: values must be int8 [N, K], K a multiple of {GROUP}")
        if tuple(self.scales.shape) != (n, k // GROUP) or self.scales.dtype not in (
                torch.float16, torch.float32):
            raise ValueError(f"int8 groups: scales must be fp16/fp32 [{n}, {k // GROUP}]")
        if self.offsets is not None and (self.offsets.shape != self.scales.shape
                                         or self.offsets.dtype != torch.float32):
            raise ValueError("int8 groups: offsets must be fp32, shaped as the scales")

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.values.shape[0]), int(self.values.shape[1]))

    @property
    def nbytes(self) -> int:
        """Bytes one product reads."""
        extra = 0 if self.offsets is None else self.offsets.nbytes
        return self.values.nbytes + self.scales.nbytes + extra

    def rows(self, lo: int, hi: int) -> Int8Groups:
        """Rows [lo, hi), as views."""
        off = None if self.offsets is None else self.offsets[lo:hi]
        return Int8Groups(self.values[lo:hi], self.scales[lo:hi], off)

    def take(self, index: torch.Tensor) -> Int8Groups:
        """Rows in the order `index` [N'] gives (copies)."""
        off = None if self.offsets is None else self.offsets[index]
        return Int8Groups(self.values[index], self.scales[index], off)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        # -> [N, K], exact in fp32
        n, k = self.shape
        w = self.values.float().view(n, k // GROUP, GROUP) * self.scales.float()[..., None]
        if self.offsets is not None:
            w = w + self.offsets[..., None]
        return w.view(n, k).to(dtype)

    def contiguous(self) -> Int8Groups:
        off = None if self.offsets is None else self.offsets.contiguous()
        return Int8Groups(self.values.contiguous(), self.scales.contiguous(), off)

    def product(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """x [B, K] -> x @ W.T [B, N] in x's dtype (fp32 sums). The closure holds contiguous
        copies where these are views of non-contiguous rows."""
        me = self.contiguous()
        if not gemv_available():
            weight = me.dequantize()
            return lambda x: (x.float() @ weight.T).to(x.dtype)
        empty = torch.empty(0)
        offsets = empty if me.offsets is None else me.offsets
        gemv = torch.ops.polyhead.gemv_int8
        return lambda x: gemv(x, me.values, me.scales, offsets)

    def to_tensors(self, name: str) -> dict[str, torch.Tensor]:
        out = {name + SUFFIXES[0]: self.values, name + SUFFIXES[1]: self.scales}
        if self.offsets is not None:
            out[name + SUFFIXES[2]] = self.offsets
        return out

    @staticmethod
    def from_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, Int8Groups]:
        """Every `<name>.int8` / `.int8_scales` (/ `.int8_offsets`) triple, by name."""
        names = [k.removesuffix(SUFFIXES[0]) for k in tensors if k.endswith(SUFFIXES[0])]
        return {n: Int8Groups(tensors[n + SUFFIXES[0]], tensors[n + SUFFIXES[1]],
                              tensors.get(n + SUFFIXES[2])) for n in names}

    @staticmethod
    def cat(parts: list[Int8Groups]) -> Int8Groups:
        """Parts stacked along N (fused projections of one input): scales widen to fp32 when
        the parts differ, and a symmetric part gets zero offsets beside an asymmetric one."""
        if len({p.shape[1] for p in parts}) != 1:
            raise ValueError("int8 groups: parts to stack must share K")
        dtype = parts[0].scales.dtype if len({p.scales.dtype for p in parts}) == 1 \
            else torch.float32
        values = torch.cat([p.values for p in parts])
        scales = torch.cat([p.scales.to(dtype) for p in parts])
        if all(p.offsets is None for p in parts):
            return Int8Groups(values, scales)
        offsets = torch.cat([torch.zeros(p.scales.shape) if p.offsets is None else p.offsets
                             for p in parts])
        return Int8Groups(values, scales, offsets)


def gemv_available() -> bool:
    """Whether polyhead's fused CPU ops are loaded with the int8 GEMV (AVX512-BW builds)."""
    return hasattr(torch.ops.polyhead, "gemv_int8")

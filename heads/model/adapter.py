"""What a head's logits are computed from: its unembedding rows, plus its adapter if any.

`HeadOutput` is the one description every logits path uses (the engine's kernels, prompt
scoring, BPB evaluation, the vLLM export): logits = weight · hidden(h) + bias.

A `lowrank` adapter is folded once, at load, into the head's own copy of its rows
(W + A B, [V, d] in the compute dtype), so decoding costs exactly what the unadapted head
costs; the shared matrix is not touched. A `hidden` adapter keeps the shared rows (a view)
and maps h to h + U (D h) before the product, 2 r d FLOPs per position.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from heads.errors import CheckpointError
from heads.manifest import BIAS, HIDDEN_DOWN, HIDDEN_UP, LOWRANK_A, LOWRANK_B, AdapterSpec


@dataclass(frozen=True)
class HeadOutput:
    weight: torch.Tensor  # [V, d], compute dtype; a view of the shared matrix unless folded
    bias: torch.Tensor | None = None  # [V], compute dtype
    down: torch.Tensor | None = None  # [r, d]: the hidden adapter's D
    up: torch.Tensor | None = None  # [d, r]: its U

    @property
    def adapted(self) -> bool:
        return self.bias is not None

    def hidden(self, h: torch.Tensor) -> torch.Tensor:
        # h: [N, d] -> [N, d], what the rows multiply
        if self.down is None or self.up is None:
            return h
        return h + (h @ self.down.to(h.dtype).T) @ self.up.to(h.dtype).T

    def logits(self, h: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        """[N, d] -> [N, V] in h's dtype; `weight` replaces the rows by a copy in another
        dtype (an fp32 copy for exact BPB), which must hold the same values."""
        w = self.weight if weight is None else weight
        out = self.hidden(h) @ w.to(h.dtype).T
        return out if self.bias is None else out + self.bias.to(out.dtype)

    def to(self, dtype: torch.dtype) -> HeadOutput:
        def cast(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(dtype)

        return HeadOutput(self.weight.to(dtype), cast(self.bias), cast(self.down), cast(self.up))


def fold_lowrank(rows: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                 dtype: torch.dtype) -> torch.Tensor:
    """W + A B in fp32, then rounded once to `dtype`. rows [V, d], a [V, r], b [r, d].
    Every consumer (local engine, vLLM export) calls this, so they hold the same bits."""
    return (rows.float() + a.float() @ b.float()).to(dtype).contiguous()


def build_output(spec: AdapterSpec | None, rows: torch.Tensor,
                 tensors: dict[str, torch.Tensor], dtype: torch.dtype,
                 where: str) -> HeadOutput:
    """The HeadOutput of one head from its rows [V, d] (already in `dtype`) and the
    checkpoint tensors; raises CheckpointError when an adapter tensor is missing or
    misshapen."""
    if spec is None:
        return HeadOutput(rows)
    need = spec.shapes(rows.shape[0], rows.shape[1])
    for name, shape in need.items():
        if name not in tensors:
            raise CheckpointError(f"{where}.adapter: tensor {name!r} missing")
        if tuple(tensors[name].shape) != shape:
            raise CheckpointError(f"{where}.adapter: tensor {name!r} has shape "
                                  f"{tuple(tensors[name].shape)}, need {shape}")
    p = spec.prefix
    bias = tensors[p + BIAS].to(dtype)
    if spec.kind == "lowrank":
        folded = fold_lowrank(rows, tensors[p + LOWRANK_A], tensors[p + LOWRANK_B], dtype)
        return HeadOutput(folded, bias)
    return HeadOutput(rows, bias, tensors[p + HIDDEN_DOWN].to(dtype),
                      tensors[p + HIDDEN_UP].to(dtype))


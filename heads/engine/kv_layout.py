"""How the layers' KV shares one block pool: layers are split into equal-size groups of one
attention kind, and each sequence holds one block table per group.

A block is `block_size` tokens of K and V for the `group_size` layers of one group. Full
attention groups keep a block for every position; sliding-window groups keep only the blocks
the window can still reach and free the rest as the sequence grows. On Gemma-3-270M (15
sliding layers of window 512, 3 full) the groups are 3 layers each: 1 full and 5 sliding, so
at 4k tokens a sequence holds 256 + 5 x 33 blocks of 3 layers instead of 256 blocks of 18.

Layer l reads and writes slot `slot[l]` of the pool (one K/V tensor pair per slot), through
its group's block table. Layers of different groups share a slot's tensors but never a block.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from heads.manifest import BackboneConfig

log = logging.getLogger(__name__)

SLIDING = "sliding_attention"


@dataclass(frozen=True, slots=True)
class KVLayout:
    windows: tuple[int | None, ...]  # per group: the sliding window, None for full attention
    layer_group: tuple[int, ...]  # per layer: its group
    layer_slot: tuple[int, ...]  # per layer: its tensor slot, 0..group_size-1
    group_size: int  # layers per group (= K/V tensor pairs in the pool)

    @staticmethod
    def single(num_layers: int) -> KVLayout:
        """Every layer full attention, one group (no per-group bookkeeping)."""
        return KVLayout((None,), (0,) * num_layers, tuple(range(num_layers)), num_layers)

    @staticmethod
    def for_backbone(b: BackboneConfig, sliding_kv: bool = True) -> KVLayout:
        """Groups for the backbone's layer types; sliding_kv False keeps every layer's full
        context (one group, as before sliding-window KV)."""
        types = b.layer_types or ("full_attention",) * b.num_layers
        sliding = [i for i, t in enumerate(types) if t == SLIDING]
        full = [i for i, t in enumerate(types) if t != SLIDING]
        if not sliding_kv or not sliding or not full or b.sliding_window is None:
            # All one kind: one group. (All-sliding would save KV too, but no model here has it.)
            return KVLayout.single(b.num_layers)
        size = math.gcd(len(sliding), len(full))
        windows: list[int | None] = []
        group = [0] * b.num_layers
        slot = [0] * b.num_layers
        for layers, window in ((full, None), (sliding, b.sliding_window)):
            for start in range(0, len(layers), size):
                for j, layer in enumerate(layers[start:start + size]):
                    group[layer], slot[layer] = len(windows), j
                windows.append(window)
        return KVLayout(tuple(windows), tuple(group), tuple(slot), size)

    @property
    def num_groups(self) -> int:
        return len(self.windows)

    @property
    def num_layers(self) -> int:
        return len(self.layer_group)

"""The concatenated vocabulary that lets one vLLM engine serve every head.

vLLM knows one vocabulary per engine, so head h owns the global IDs [off_h, off_h + V_h),
with the heads laid end to end in manifest order. The gateway adds off_h to the IDs it
tokenized with head h and subtracts it from what comes back; the model maps a global ID back
to (head, local ID) to find its row of the head's (shared, nested) matrix.

This module is pure Python: the export, the vLLM plugin and the gateway backend all read the
same layout, so the three cannot disagree on an offset.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

from heads.errors import CheckpointError
from heads.manifest import ADAPTER_KINDS, HeadSpec, Manifest, folded_rows_name

CONFIG_KEY = "polyhead"  # the config.json entry the plugin reads
ARCHITECTURE = "PolyheadForCausalLM"
# Adapter tensors of head i (its index in the layout) in the exported weights.
BIAS_PREFIX, DOWN_PREFIX, UP_PREFIX = "head_biases.", "head_down.", "head_up."


@dataclass(frozen=True, slots=True)
class HeadRange:
    name: str
    offset: int  # first global ID
    vocab_size: int
    embedding: int  # index into VocabLayout.matrices
    unembedding: int
    eos_token_ids: tuple[int, ...]  # local IDs
    # The head's adapter: "" none; "lowrank" (folded into its own unembedding matrix) and
    # "hidden" (rank `adapter_rank`) both add a bias [V_h].
    adapter: str = ""
    adapter_rank: int = 0


@dataclass(frozen=True, slots=True)
class VocabLayout:
    heads: tuple[HeadRange, ...]
    matrices: tuple[tuple[str, int], ...]  # (checkpoint tensor name, rows); [0] is embed_tokens

    @property
    def total_vocab(self) -> int:
        last = self.heads[-1]
        return last.offset + last.vocab_size

    @property
    def bounds(self) -> list[int]:
        """Start offsets after the first head: bucketize(global_id, bounds) = head index."""
        return [h.offset for h in self.heads[1:]]

    def head(self, name: str) -> HeadRange:
        for h in self.heads:
            if h.name == name:
                return h
        raise KeyError(f"unknown head {name!r}; have {[h.name for h in self.heads]}")

    def head_of(self, global_id: int) -> HeadRange:
        if not 0 <= global_id < self.total_vocab:
            raise ValueError(f"token id {global_id} outside [0, {self.total_vocab})")
        return self.heads[bisect.bisect_right(self.bounds, global_id)]

    def all_eos(self) -> list[int]:
        return [h.offset + t for h in self.heads for t in h.eos_token_ids]

    @classmethod
    def from_manifest(cls, manifest: Manifest) -> VocabLayout:
        matrices: dict[str, int] = {}  # name -> rows: the largest V of any head reading it
        for h in manifest.heads:
            for name in (h.embedding, unembedding_name(h)):
                matrices[name] = max(matrices.get(name, 0), h.vocab_size)
        index = {name: i for i, name in enumerate(matrices)}
        heads, offset = [], 0
        for h in manifest.heads:
            a = h.adapter
            heads.append(HeadRange(h.name, offset, h.vocab_size, index[h.embedding],
                                   index[unembedding_name(h)], tuple(h.eos_token_ids),
                                   "" if a is None else a.kind, 0 if a is None else a.rank))
            offset += h.vocab_size
        return cls(tuple(heads), tuple(matrices.items()))

    def to_json(self) -> dict[str, Any]:
        return {
            "heads": [
                {"name": h.name, "offset": h.offset, "vocab_size": h.vocab_size,
                 "embedding": h.embedding, "unembedding": h.unembedding,
                 "eos_token_ids": list(h.eos_token_ids), "adapter": h.adapter,
                 "adapter_rank": h.adapter_rank}
                for h in self.heads
            ],
            "matrices": [{"name": n, "rows": r} for n, r in self.matrices],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> VocabLayout:
        try:
            heads = tuple(
                HeadRange(h["name"], int(h["offset"]), int(h["vocab_size"]), int(h["embedding"]),
                          int(h["unembedding"]), tuple(int(t) for t in h["eos_token_ids"]),
                          str(h.get("adapter", "")), int(h.get("adapter_rank", 0)))
                for h in data["heads"]
            )
            matrices = tuple((m["name"], int(m["rows"])) for m in data["matrices"])
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{CONFIG_KEY}: malformed head layout ({e!r})") from e
        layout = cls(heads, matrices)
        layout.validate()
        return layout

    def validate(self) -> None:
        if not self.heads:
            raise CheckpointError(f"{CONFIG_KEY}.heads: at least one head is required")
        expect = 0
        for i, h in enumerate(self.heads):
            if h.offset != expect:
                raise CheckpointError(f"{CONFIG_KEY}.heads[{i}].offset: {h.offset}, need {expect}")
            for role in ("embedding", "unembedding"):
                m = getattr(h, role)
                if not 0 <= m < len(self.matrices) or self.matrices[m][1] < h.vocab_size:
                    raise CheckpointError(f"{CONFIG_KEY}.heads[{i}].{role}: bad matrix {m}")
            if h.adapter not in ("", *ADAPTER_KINDS) or (h.adapter == "hidden"
                                                          and h.adapter_rank <= 0):
                raise CheckpointError(f"{CONFIG_KEY}.heads[{i}].adapter: bad adapter "
                                      f"{h.adapter!r} of rank {h.adapter_rank}")
            expect += h.vocab_size


def unembedding_name(h: HeadSpec) -> str:
    """The matrix a head's logits read: a low-rank adapted head reads its folded rows."""
    if h.adapter is not None and h.adapter.kind == "lowrank":
        return folded_rows_name(h.adapter)
    return h.unembedding

"""The manifest record of a head adaptation (`HeadSpec.adapter`) and its tensor names.

A trimmed head can carry a small learned correction on top of the shared, untouched matrix:

- `lowrank`: logits = (W + A B) h + b, with A [V, r] and B [r, d];
- `hidden`:  logits = W (h + U (D h)) + b, with D [r, d] and U [d, r].

W is the head's rows [0, V) of the shared matrix and h its final-normed hidden state [d].
The tensors (fp32, a few MB per head) live in a sidecar safetensors file of their own, so
adapting never rewrites the shared weights: the new file is written first and the manifest
that names it replaces the old one atomically.
The native (largest) head is never adapted: it is the teacher the others are fitted to.
"""

from __future__ import annotations

from dataclasses import dataclass

from heads.errors import CheckpointError

KINDS = ("lowrank", "hidden")
BIAS = "bias"  # [V]
LOWRANK_A, LOWRANK_B = "a", "b"  # [V, r], [r, d]
HIDDEN_DOWN, HIDDEN_UP = "down", "up"  # [r, d], [d, r]


@dataclass(frozen=True, slots=True)
class AdapterSpec:
    kind: str  # one of KINDS
    rank: int  # r
    prefix: str  # tensor names are prefix + BIAS, LOWRANK_A, ...
    file: str  # safetensors file holding them, relative to the checkpoint directory
    steps: int = 0  # optimizer steps the stored tensors come from (the best held-out BPB)
    data: tuple[str, ...] = ()  # training sources (corpus file names)
    train_positions: int = 0  # scored positions in the training set
    heldout_bpb_before: float | None = None  # held-out BPB of the head without the adapter
    heldout_bpb_after: float | None = None  # and with it; same text, same byte windows

    def validate(self, where: str) -> None:
        if self.kind not in KINDS:
            raise CheckpointError(f"{where}.kind: {self.kind!r} not in {KINDS}")
        if self.rank <= 0:
            raise CheckpointError(f"{where}.rank: must be > 0")
        if not self.prefix:
            raise CheckpointError(f"{where}.prefix: must be non-empty")
        if not self.file.endswith(".safetensors") or ".." in self.file.split("/"):
            raise CheckpointError(f"{where}.file: need a .safetensors path inside the "
                                  f"checkpoint, got {self.file!r}")
        if self.steps < 0 or self.train_positions < 0:
            raise CheckpointError(f"{where}: steps and train_positions must be >= 0")

    def shapes(self, vocab_size: int, hidden_size: int) -> dict[str, tuple[int, ...]]:
        """Tensor name -> shape, for a head of `vocab_size` rows and hidden size d."""
        v, d, r = vocab_size, hidden_size, self.rank
        mats = ({LOWRANK_A: (v, r), LOWRANK_B: (r, d)} if self.kind == "lowrank"
                else {HIDDEN_DOWN: (r, d), HIDDEN_UP: (d, r)})
        return {self.prefix + k: s for k, s in {BIAS: (v,), **mats}.items()}

    def names(self) -> list[str]:
        return list(self.shapes(1, 1))


def default_prefix(head: str) -> str:
    return f"adapters.{head}."


def folded_rows_name(spec: AdapterSpec) -> str:
    """The name an export gives a low-rank head's folded rows W + A B [V, d]."""
    return spec.prefix + "rows"

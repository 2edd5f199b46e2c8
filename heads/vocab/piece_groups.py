"""The groups of a boundary-preserving head's two-level reading of the native vocabulary.

A split head spells each native token t past its V as pieces; t's first piece p(t) is one of
the head's own tokens. Group p is p itself plus every removed native token whose spelling
starts with p, so the groups partition the native ids and each is led by its own piece.
Read in two levels, the head's V rows pick the group and the group's native rows pick the
token (heads/eval/grouped.py scores it, heads/engine/grouped_reading.py serves it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from heads.vocab.split_table import SplitTable


@dataclass(frozen=True, slots=True)
class PieceGroups:
    """Group of each head token: `members[offsets[p]:offsets[p + 1]]`, native ids, p first."""

    piece: np.ndarray  # [native V] int64: the head token whose group holds each native id
    offsets: np.ndarray  # [V + 1] int64
    members: np.ndarray  # [native V] int64
    rank: np.ndarray  # [native V] int64: position of each native id inside its group

    @classmethod
    def from_split(cls, table: SplitTable) -> PieceGroups:
        v, n = table.vocab_size, table.native_size
        piece = table.pieces[table.offsets[:-1]].astype(np.int64)  # first piece, [n]
        piece[:v] = np.arange(v)  # a kept token heads its own group
        # Stable sort by piece: p (id < V) precedes the removed ids it starts.
        members = np.argsort(piece, kind="stable")
        offsets = np.zeros(v + 1, dtype=np.int64)
        np.cumsum(np.bincount(piece, minlength=v), out=offsets[1:])
        rank = np.empty(n, dtype=np.int64)
        rank[members] = np.arange(n) - offsets[piece[members]]
        return cls(piece, offsets, members, rank)

    def group(self, p: int) -> np.ndarray:
        return self.members[self.offsets[p]:self.offsets[p + 1]]

    @property
    def sizes(self) -> np.ndarray:
        """[V] int64: members per group (1 where the piece leads no removed token)."""
        return np.diff(self.offsets)

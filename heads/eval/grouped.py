"""A nested head read as the first level of a two-level softmax over the native vocabulary.

A boundary-preserving head spells each native token t past its V as pieces; t's first piece
p(t) is one of the head's own tokens. Group p is p itself plus every removed native token
whose spelling starts with p. Scored this way, the head predicts native tokens:

    P(t | ctx) = softmax(h W[:V])[p(t)] · softmax(h W[group p(t)])[t]

with h the backbone's state over the *native* tokens so far, so the backbone never reads a
split word and every later piece of one is implied by t (no bits). The first factor reads
the head's V rows, the second only the rows of the sampled piece's group. What stays lost is
the first factor's deficit: row p alone stands for its whole group's mass. This is the
nested-tokenization view of lossless vocabulary reduction (Chijiwa et al., ICLR 2026,
arXiv 2510.08102) with a per-piece shortlist in place of the full vocabulary.

Only measured here (`polyhead heads eval --grouped`); the engine does not serve it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from heads.model.forward import forward_hidden
from heads.model.weights import Checkpoint
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


@torch.inference_mode()
def grouped_token_bits(ckpt: Checkpoint, head: str, native: str, ids: list[int],
                       groups: PieceGroups, rows: torch.Tensor
                       ) -> tuple[torch.Tensor, float]:
    """(-log2 P(t | context) per native id [len(ids)] fp64, seconds in the backbone), with
    the whole of `ids` as one context after BOS. `rows`: the native unembedding in fp32
    [native V, d], whose first V rows are `head`'s."""
    v = ckpt.manifest.head(head).vocab_size
    bos = ckpt.manifest.head(native).bos_token_id
    ctx = ([] if bos is None else [bos]) + ids
    t0 = time.perf_counter()
    hidden = forward_hidden(ckpt, native, ctx)[:-1].float()  # [T, d], predicts ctx[1:]
    seconds = time.perf_counter() - t0
    scored = ids if bos is not None else ids[1:]  # without BOS the first id has no context
    nats = [0.0] * (len(ids) - len(scored))
    for r in range(0, len(scored), 128):  # [128, V] fp32 logits at a time
        logp = torch.log_softmax(hidden[r:r + 128] @ rows[:v].T, dim=-1)
        for i in range(r, min(r + 128, len(scored))):
            t = scored[i]
            p = int(groups.piece[t])
            nat = -float(logp[i - r, p])
            members = groups.group(p)
            if len(members) > 1:  # which native token of the group: its rows only
                logits = rows[torch.from_numpy(members)] @ hidden[i]
                nat -= float(logits[int(groups.rank[t])] - torch.logsumexp(logits, 0))
            nats.append(nat)
    return torch.tensor(nats, dtype=torch.float64) / math.log(2), seconds


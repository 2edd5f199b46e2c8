"""A nested head read as the first level of a two-level softmax over the native vocabulary.

A boundary-preserving head spells each native token t past its V as pieces; t's first piece
p(t) is one of the head's own tokens. Group p is p itself plus every removed native token
whose spelling starts with p. Scored this way, the head predicts native tokens:

    P(t | ctx) = softmax(h W[:V])[p(t)] · softmax(h W[group p(t)])[t]

with h the backbone's state over the *native* tokens so far, so the backbone never reads a
split word and every later piece of one is implied by t (no bits). The first factor reads
the head's V rows (through the reading's adapter when it has one, HeadSpec.reading_adapter),
the second only the rows of the sampled piece's group. What stays lost is
the first factor's deficit: row p alone stands for its whole group's mass. This is the
nested-tokenization view of lossless vocabulary reduction (Chijiwa et al., ICLR 2026,
arXiv 2510.08102) with a per-piece shortlist in place of the full vocabulary.

Scored here for `polyhead heads eval --grouped`; the local engine serves the same reading
(heads/engine/grouped_reading.py).
"""

from __future__ import annotations

import math
import time

import torch

from heads.model.adapter import HeadOutput
from heads.model.forward import forward_hidden
from heads.model.weights import Checkpoint
from heads.vocab.piece_groups import PieceGroups


@torch.inference_mode()
def first_level(ckpt: Checkpoint, head: str) -> HeadOutput:
    """`head`'s reading's first level in fp32: its V rows, adapted where the reading is."""
    return ckpt.model.reading_output(head).to(torch.float32)


def grouped_token_bits(ckpt: Checkpoint, native: str, ids: list[int], groups: PieceGroups,
                       level1: HeadOutput, rows: torch.Tensor, first: int = 0
                       ) -> tuple[torch.Tensor, float]:
    """(-log2 P(t | context) per native id [len(ids)] fp64, seconds in the backbone), with
    the whole of `ids` as one context after BOS. `level1`: the reading's first level
    (first_level); `rows`: the native unembedding in fp32 [native V, d], which the second
    level reads. `first`: ids before it are context only (their entries are 0, not
    scored)."""
    bos = ckpt.manifest.head(native).bos_token_id
    ctx = ([] if bos is None else [bos]) + ids
    t0 = time.perf_counter()
    hidden = forward_hidden(ckpt, native, ctx)[:-1].float()  # [T, d], predicts ctx[1:]
    seconds = time.perf_counter() - t0
    scored = ids if bos is not None else ids[1:]  # without BOS the first id has no context
    skip = max(0, first - (len(ids) - len(scored)))  # context-only ids among `scored`
    nats = [0.0] * (len(ids) - len(scored) + skip)
    for r in range(skip, len(scored), 128):  # [128, V] fp32 logits at a time
        logp = torch.log_softmax(level1.logits(hidden[r:r + 128]), dim=-1)
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


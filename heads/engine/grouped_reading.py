"""A split head's two-level reading served as a head of its own, `<head>+groups`.

The reading reads and emits native ids, so its KV cache, prefix cache and bytes per token
are the native head's and the backbone never sees a split word. What it saves is the
unembedding: a step reads the head's V rows, plus the rows of one group per sequence
(heads/vocab/piece_groups.py), instead of every native row.

    level 1: the kernels sample piece p from softmax(h W[:V] / T), top-k / top-p applied;
             W[:V] are the native head's first rows, so this shares the nested pass with
             every head whose rows are a prefix of the same matrix;
    level 2: where p leads removed tokens, p's group's native rows [n_p, d] give
             softmax(h W[group p] / T), sampled with noise from a stream of its own
             (seed ^ LEVEL2_STREAM), so it is independent of the noise level 1 drew at p.

The reported logprob is log P1(p) + log P2(t | p) at T = 1: the reading's own distribution,
the one `heads eval --grouped` scores. Greedy takes the argmax of each level: the most
likely token of the most likely group, not always the argmax of the product.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from heads.engine.sequence import Sequence
from heads.errors import EngineUnsupported
from heads.manifest import READING_SUFFIX
from heads.model.adapter import HeadOutput
from heads.model.weights import Checkpoint
from heads.vocab.piece_groups import PieceGroups
from heads.vocab.tokenizer import HeadTokenizer
from kernels import rng
from kernels.sampling_params import SampleOutput, SamplingBatch

LEVEL2_STREAM = 0x2545F4914F6CDD1D  # xor'ed into the seed: level 2's noise stream


@dataclass(frozen=True)
class GroupedReading:
    name: str  # `<head>+groups`
    head: str  # the split head whose V rows are level 1
    vocab: int  # its V
    offsets: torch.Tensor  # [V + 1] int64: group p is members[offsets[p]:offsets[p + 1]]
    members: torch.Tensor  # [V_native] int64, native ids, each group led by its piece
    piece: torch.Tensor  # [V_native] int64: the group (piece) of each native id

    @classmethod
    def of(cls, head: str, groups: PieceGroups) -> GroupedReading:
        return cls(head + READING_SUFFIX, head, len(groups.offsets) - 1,
                   torch.from_numpy(groups.offsets), torch.from_numpy(groups.members),
                   torch.from_numpy(groups.piece))

    @classmethod
    def of_split_head(cls, tokenizers: Mapping[str, HeadTokenizer], head: str
                      ) -> GroupedReading:
        split = tokenizers[head].split if head in tokenizers else None
        if split is None:
            raise EngineUnsupported(f"head {head!r} has no split table: only a "
                                    "boundary-preserving head has a two-level reading")
        return cls.of(head, PieceGroups.from_split(split))

    @classmethod
    def served(cls, ckpt: Checkpoint) -> list[GroupedReading]:
        """The readings a checkpoint as served holds (Checkpoint.with_readings)."""
        return [cls.of_split_head(ckpt.tokenizers, h.reads)
                for h in ckpt.manifest.heads if h.reads is not None]

    def refuse(self, seq: Sequence) -> None:
        """What the reading does not serve yet: each needs the logits of every native id,
        which it never materialises (a grammar, logit rules, alternatives, a prompt score)."""
        asked = [what for what, on in (
            ("structured output", seq.constraint is not None),
            ("logit rules (bias, penalties, min_p)", seq.rules.shapes),
            ("top_logprobs", seq.top_logprobs > 0),
            ("prompt_logprobs", seq.prompt_logprobs is not None),
            ("prompt scoring", seq.score_prompt)) if on]
        if asked:
            raise EngineUnsupported(f"head {self.name!r} does not serve {', '.join(asked)}")

    def log_probs(self, native_logits: torch.Tensor, first_logits: torch.Tensor
                  ) -> torch.Tensor:
        """The reading's log P(t) at T = 1 for every native id, from the native head's logits
        [k, V_native] and its first level's [k, V], both fp32 -> [k, V_native]:
        log softmax(first)[p(t)] + z[t] − logsumexp(z[group p(t)])."""
        piece = self.piece.to(native_logits.device)
        top = native_logits.max(dim=1, keepdim=True).values  # [k, 1]
        sums = torch.zeros_like(first_logits).index_add_(1, piece, (native_logits - top).exp())
        group_lse = sums.log() + top  # [k, V]
        first = torch.log_softmax(first_logits, dim=-1)  # [k, V]
        return (first - group_lse)[:, piece] + native_logits

    def token_log_probs(self, native_logits: torch.Tensor, first_logits: torch.Tensor,
                        targets: torch.Tensor) -> torch.Tensor:
        """log P(targets[i]) for each row i, as `log_probs` but reading only the targets'
        groups: native_logits [k, V_native], first_logits [k, V], targets [k] -> [k] fp32."""
        pieces = self.piece.to(targets.device)[targets]  # [k]
        rows = torch.arange(len(targets), device=targets.device)
        out = (first_logits[rows, pieces] - torch.logsumexp(first_logits, dim=-1)
               + native_logits[rows, targets])
        lo, hi = self.offsets[pieces.cpu()].tolist(), self.offsets[pieces.cpu() + 1].tolist()
        members = self.members.to(targets.device)
        group_lse = torch.stack([torch.logsumexp(native_logits[i, members[a:b]], dim=0)
                                 for i, (a, b) in enumerate(zip(lo, hi, strict=True))])
        return out - group_lse

    def second_level(self, native: HeadOutput, hidden: torch.Tensor, first: SampleOutput,
                     batch: SamplingBatch, coupled: torch.Tensor | None = None
                     ) -> SampleOutput:
        """hidden: [b, d], the rows level 1 sampled `first.token_ids` (pieces, < V) for.
        -> native ids [b] and, where level 1 reported them, the summed logprobs [b]. Rows
        that sampled the same piece share one read of its group's rows. `coupled` [b] bool:
        rows that draft for the native head (heads.engine.drafting) draw the native head's
        own noise at each member's id, so they agree with its sample when they can; the
        others draw from the level-2 stream."""
        pieces = first.token_ids.cpu()
        tokens = pieces.clone()
        logprobs = None if first.logprobs is None else first.logprobs.clone()
        seeds = batch.seed ^ LEVEL2_STREAM
        if coupled is not None:
            seeds = torch.where(coupled, batch.seed, seeds)
        lo, hi = self.offsets[pieces], self.offsets[pieces + 1]
        wide = torch.nonzero(hi - lo > 1).squeeze(1)
        for p in torch.unique(pieces[wide]).tolist():
            rows = wide[pieces[wide] == p]  # [k]
            ids = self.members[self.offsets[p]:self.offsets[p + 1]].to(native.weight.device)
            h = native.hidden(hidden[rows.to(hidden.device)])  # [k, d]
            logits = (h @ native.weight[ids].T).float()  # [k, n_p]
            pick = _sample_members(logits, ids, batch.temperature[rows], seeds[rows],
                                   batch.position[rows])
            tokens[rows] = ids[pick].cpu()
            if logprobs is not None:
                lp = torch.log_softmax(logits, dim=-1).gather(1, pick[:, None]).squeeze(1)
                logprobs[rows] += lp.to(logprobs.dtype).cpu()
        return SampleOutput(tokens.to(first.token_ids.device), logprobs)


def _sample_members(logits: torch.Tensor, ids: torch.Tensor, temperature: torch.Tensor,
                    seed: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """Gumbel-max over one group's members: logits [k, n_p], ids [n_p] native ids -> [k]
    member indices. The noise is keyed by native id (kernels.rng), so with the native
    head's seed it is exactly the noise that head draws for these ids; greedy rows
    (temperature 0) take the argmax."""
    pick = torch.argmax(logits, dim=-1)
    hot = torch.nonzero(temperature > 0).squeeze(1)
    if hot.numel():
        t = temperature[hot].to(logits.device)[:, None]
        noise = rng.gumbel(seed[hot].to(logits.device), position[hot].to(logits.device), ids)
        pick[hot] = torch.argmax(logits[hot] / t + noise, dim=-1)
    return pick

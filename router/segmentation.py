"""Per-request quality: each head's predicted BPB penalty from how its segmentation departs
from the largest (native) head's, and the bound that keeps a request off heads too far behind.

The backbone learned the native head's segmentation. A trimmed head spells the same text in
more, shorter tokens, and, where it lost a script entirely, in `<0xXX>` byte tokens; both
cost bits per byte. For head h on this prompt:

    split_h    = 1 − tokens_native / tokens_h          share of h's tokens the split added
    fallback_h = bytes spelled in byte tokens ÷ prompt bytes
    penalty_h  = a · split_h + b · fallback_h          predicted BPB_h ÷ BPB_native − 1

A prompt is a small sample of the text the answer will be in: a 50-token English prompt
that the 32k head happens to spell like the native one says little about the next 50 tokens,
which split at the head's usual rate. So split_h is not the prompt's own share but its
shrinkage towards the head's prior share p_h (the smallest split share the head showed on any
evaluated language: the most lenient prior the evaluation supports), a Beta-binomial mean
with SPLIT_PRIOR_TOKENS tokens of prior evidence:

    split_h = (tokens_h − tokens_native + K · p_h) / (tokens_h + K)

Measured on 600 prompt/continuation pairs of the multilingual replay trace (demo heads): the
prompt's own share passed 5% of them through a 5% bound on the 32k head at a continuation
split of 7.6% (about +27% BPB); K = 64 predicts the continuation's English split share with
the least error of K in {0, 8, …, 128} (RMSE 0.065 against 0.080 unshrunk).

The split share, not the raw extra-token ratio, is what the loss follows: measured on the
demo's heads over 14 languages, the penalty is 1.2–3.5× the split share whether a head
splits a few English words (+49% BPB at 15% split) or spells Hindi byte by byte (+175% at
89%), where the extra-token ratio runs from 0.2 to 8. (a, b) are fitted by least squares
through the origin on that evaluation (`polyhead heads eval --languages all`, then
`polyhead heads fit-penalty`); `PenaltyFit.fit` does the fit. `heads build` and the demo
build fit each head on its own languages (`fit_by_head`: the upper envelope, so the bound
never admits a language the evaluation measured past it) and store the fit in the manifest,
so a rebuilt head never runs on another build's fit; `DEFAULT_FIT` is only for checkpoints
without one. A head is excluded for a request when (1 + penalty_h) ÷ (1 + min penalty) − 1
exceeds the policy's `max_bpb_loss`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from router.profiles import HeadProfile, RequestFeatures

log = logging.getLogger(__name__)


SPLIT_PRIOR_TOKENS = 64  # K: tokens of evidence the head's prior split share counts as


@dataclass(frozen=True, slots=True)
class PenaltyFit:
    per_split: float  # a: relative BPB loss per unit of split share
    per_fallback_share: float  # b: relative BPB loss per unit share of byte-token bytes
    prior_split: float = 0.0  # p: the split share a prompt's own is shrunk towards

    def penalty(self, split: float, fallback: float) -> float:
        return max(0.0, self.per_split * max(0.0, split) + self.per_fallback_share * fallback)

    def split_share(self, native_tokens: int, head_tokens: int) -> float:
        """The predicted split share of the request's text on this head, from its prompt
        (native_tokens, head_tokens) shrunk towards prior_split."""
        k = SPLIT_PRIOR_TOKENS
        return (head_tokens - native_tokens + k * self.prior_split) / (head_tokens + k)

    @staticmethod
    def fit(points: Sequence[tuple[float, float, float]]) -> PenaltyFit:
        """Least squares through the origin on (split, fallback, observed penalty) points."""
        sxx = sum(x * x for x, _, _ in points)
        sff = sum(f * f for _, f, _ in points)
        sxf = sum(x * f for x, f, _ in points)
        sxy = sum(x * y for x, _, y in points)
        sfy = sum(f * y for _, f, y in points)
        det = sxx * sff - sxf * sxf
        # Neither splitting nor byte fallback makes a head better than native: a negative
        # slope is measurement noise on a near-native head, and clamps to 0.
        split_only = PenaltyFit(max(0.0, sxy / sxx) if sxx > 0 else 0.0, 0.0)
        if abs(det) < 1e-12:  # no fallback in the data: one coefficient
            return split_only
        a = (sxy * sff - sfy * sxf) / det
        b = (sfy * sxx - sxy * sxf) / det
        if b < 0:  # byte fallback never helps; refit without it
            return split_only
        if a < 0:
            return PenaltyFit(0.0, max(0.0, sfy / sff) if sff > 0 else 0.0)
        return PenaltyFit(a, b)

    @staticmethod
    def envelope(points: Sequence[tuple[float, float, float]],
                 min_split: float = 0.05) -> PenaltyFit:
        """The smallest split coefficient that predicts at least the measured penalty on
        every point splitting at least `min_split` (below it the measured loss is within the
        evaluation's noise): what a bound needs, since under-predicting one language lets
        its requests through at a loss the bound was set to refuse. Least squares through
        the origin would let the languages that split much but lose little (Russian at 2.2×
        its split share on the demo's 32k head) pull English (3.1×) under the bound."""
        ratios = [y / x for x, _, y in points if x >= min_split]
        return PenaltyFit(max(0.0, *ratios) if ratios else 0.0, 0.0)


# Fitted on the Gemma-3 demo heads' evaluation over 14 languages (28 head/language points,
# mean absolute error 0.19): byte fallback adds nothing the split share does not already
# say. The README's "How a head is chosen" has the table and the command that refits it.
DEFAULT_FIT = PenaltyFit(per_split=2.61, per_fallback_share=0.0)


def fit_points(by_source: Mapping[str, Mapping[str, Mapping[str, float]]],
               vocab: Mapping[str, int], split_of: Mapping[str, str] | None = None
               ) -> list[tuple[str, str, float, float, float]]:
    """(source, head, split, fallback, observed penalty) from an evaluation table: source ->
    head -> {bytes_per_token, byte_fallback_share (of tokens), bpb}, as `polyhead heads eval`
    writes it (eval-by-source.json); `vocab`: head -> V, to find the native head;
    `split_of`: reading -> the split head whose segmentation gives its split share."""
    spelled = dict(split_of or {})
    out = []
    for source, row in by_source.items():
        heads = [h for h in row if h in vocab and spelled.get(h, h) in row]
        if len(heads) < 2:
            continue
        native = max((h for h in heads if h not in spelled), key=vocab.__getitem__)
        ref = row[native]
        for h in heads:
            if h == native:
                continue
            x = row[spelled.get(h, h)]
            bpt = float(x["bytes_per_token"])
            split = 1.0 - bpt / float(ref["bytes_per_token"])  # 1 − tokens_native / tokens_h
            fallback = float(x.get("byte_fallback_share", 0.0)) / bpt  # of tokens -> of bytes
            out.append((source, h, split, fallback,
                        float(row[h]["bpb"]) / float(ref["bpb"]) - 1.0))
    return out


def fit_by_head(points: Sequence[tuple[str, str, float, float, float]]
                ) -> dict[str, tuple[PenaltyFit, float, int]]:
    """head -> (its fit, mean absolute error, points) from `fit_points` rows: the upper
    envelope (`PenaltyFit.envelope`) of each head's own languages, with its smallest split
    share over them as the prior."""
    heads: dict[str, list[tuple[float, float, float]]] = {}
    for _, head, x, f, y in points:
        heads.setdefault(head, []).append((x, f, y))
    out = {}
    for head, pts in heads.items():
        fit = replace(PenaltyFit.envelope(pts), prior_split=max(0.0, min(x for x, _, _ in pts)))
        mae = sum(abs(fit.penalty(x, f) - y) for x, f, y in pts) / len(pts)
        out[head] = (fit, mae, len(pts))
    return out


def penalties(profiles: Sequence[HeadProfile], features: RequestFeatures,
              fit: PenaltyFit) -> dict[str, float]:
    """head -> predicted relative BPB penalty; empty when the prompt was not tokenized. A
    head's own fit (`HeadProfile.bpb_penalty`) wins over `fit`."""
    tokenized = [p for p in profiles if p.name in features.tokens]
    if not tokenized:
        return {}
    native = max(tokenized, key=lambda p: p.vocab_size)
    base = features.tokens[native.name].prompt_tokens
    out = {}
    for p in tokenized:
        own = fit if p.bpb_penalty is None else PenaltyFit(*p.bpb_penalty)
        # A reading emits native ids; its loss follows how much its split head splits.
        spelled = p.reads if p.reads is not None and p.reads in features.tokens \
            else p.name
        split = own.split_share(base, features.tokens[spelled].prompt_tokens)
        out[p.name] = own.penalty(split, features.fallback_share(spelled))
    return out


def excluded_by_bound(penalty: Mapping[str, float], bound: float | None) -> dict[str, float]:
    """head -> its predicted loss over the request's best head, for heads past the bound."""
    if bound is None or not penalty:
        return {}
    best = min(penalty.values())
    loss = {h: (1.0 + p) / (1.0 + best) - 1.0 for h, p in penalty.items()}
    return {h: round(v, 4) for h, v in loss.items() if v > bound}

"""Exact drafting: a reading drafts native ids, the native head verifies them later.

A reading (heads.engine.grouped_reading) emits native ids and reads the backbone's hidden
state, which does not depend on the head that reads it. So a sequence can decode on the
cheap reading for k steps, keep each step's hidden row [d], and on the next step let the
native head read all of them at once: one product over the k saved rows and the step's own
row ([k + 1, d] x [V_native, d]). Row j gives the native token at draft j's position, which
is exactly what native decoding would have produced there as long as drafts 0..j-1 were
accepted. The longest prefix of drafts that equal those tokens is kept, the native token
after it is appended (at the first mismatch, or the extra token when every draft held), and
the rest are dropped along with their KV. No second backbone pass, no draft model.

Sampling stays exact because the noise is keyed by (seed, position, native id)
(kernels.rng): the native token at a position is a function of the hidden row and the
seed, the same function a pinned native head evaluates. The drafter samples with the same
noise (a reading in drafting mode keys its second level by native id), so it agrees with
the native sample whenever its distribution is close: a coupling, not the accept/reject
rule of speculative sampling, and the output equals native decoding with the same seed
token for token. Greedy is the zero-noise case.

Only the verified tokens reach the client. The steps are synchronised: a step that reads
the native rows at all verifies every drafting sequence with drafts pending, so the
verifies of a batch share one read. k, the drafts a step lets each sequence collect before
the native head reads, is chosen per batch from measured step times (StepCosts) and each
sequence's running acceptance; k = 0 is a plain native step.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from heads.engine.sequence import Sequence
from heads.engine.types import DraftTally

log = logging.getLogger(__name__)

MAX_DRAFTS = 7  # k ceiling: past it a rejection wastes more steps than the read saves
PRIOR_ACCEPTANCE = 0.8  # per-draft acceptance before a sequence or drafter has any
PRIOR_WEIGHT = 8  # the prior counts as this many verified drafts
PRIOR_DRAFT_SHARE = 0.6  # a drafting step's time ÷ a native step's, before measuring
EMA = 0.2


@dataclass(frozen=True, slots=True)
class DraftOutcome:
    """What one drafting sequence's step did (the runner's output for it)."""

    row: torch.Tensor | None  # a drafting step: the hidden row [d] its draft came from
    accepted: int = 0  # a verify: the leading drafts equal to the native tokens
    logprobs: tuple[float | None, ...] = ()  # a verify: native logprob of each kept token


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens a cycle of k drafts and one verify yields: Σ_{j<=k} α^j (the accepted drafts
    plus the native token after them)."""
    return float(sum(alpha ** j for j in range(k + 1)))


class StepCosts:
    """Decode step seconds measured as traffic runs, per (drafters, batch, native rows):
    `drafters` names the batch's drafter heads, native rows 0 is a drafting step, B a plain
    native step, more a verify. Unmeasured points come from the measured neighbours at the
    same batch (linear in the rows, flat past the last), then from the nearest measured
    batch."""

    def __init__(self) -> None:
        self._s: dict[tuple[str, int, int], float] = {}
        self._lock = threading.Lock()

    def observe(self, drafters: str, batch: int, native_rows: int, seconds: float) -> None:
        key = (drafters, batch, native_rows)
        with self._lock:
            old = self._s.get(key)
            self._s[key] = seconds if old is None else (1 - EMA) * old + EMA * seconds

    def measured(self) -> dict[tuple[str, int, int], float]:
        with self._lock:
            return dict(self._s)

    def predict(self, drafters: str, batch: int, native_rows: int) -> float | None:
        s = {(b, r): v for (d, b, r), v in self.measured().items() if d == drafters}
        for b in sorted({b for b, _ in s}, key=lambda b: (abs(b - batch), b)):
            t = _along_rows({r: v for (bb, r), v in s.items() if bb == b},
                            native_rows * b / batch)
            if t is not None:
                return t
        return None


def _along_rows(row_times: dict[int, float], rows: float) -> float | None:
    """A step time at `rows` native rows from the times measured at other row counts of one
    batch. A drafting step (0 rows) is its own measurement, else the prior's share of the
    cheapest native step measured."""
    if rows in row_times:
        return row_times[int(rows)]
    native = {r: t for r, t in row_times.items() if r > 0}
    if not native:
        return None
    if rows == 0:
        return PRIOR_DRAFT_SHARE * native[min(native)]
    lower = [r for r in native if r <= rows]
    upper = [r for r in native if r >= rows]
    if lower and upper:
        lo, hi = max(lower), min(upper)
        if lo == hi:
            return native[lo]
        w = (rows - lo) / (hi - lo)
        return (1 - w) * native[lo] + w * native[hi]
    if not lower:
        return native[min(upper)]
    # Past the last measured rows: on the slope of the last two measurements. Flat would
    # price a compute-bound verify (the product grows with its rows at large batch) like a
    # plain step; one measurement alone is only trusted one doubling out (DraftPlanner).
    top = sorted(lower)[-2:]
    if len(top) < 2:
        return native[top[0]]
    slope = max(0.0, (native[top[1]] - native[top[0]]) / (top[1] - top[0]))
    return native[top[1]] + slope * (rows - top[1])


def measured_rows(costs: StepCosts, drafters: str, batch: int) -> int:
    """The most native rows measured in one step of this batch (0: none)."""
    return max((r for (d, b, r) in costs.measured() if d == drafters and b == batch),
               default=0)


class DraftPlanner:
    """Chooses each decode step's k and tells each drafting sequence whether to draft or
    verify; keeps the acceptance per drafter."""

    def __init__(self, costs: StepCosts | None = None, max_drafts: int = MAX_DRAFTS,
                 fixed_k: int | None = None) -> None:
        self.costs = costs or StepCosts()
        self.max_drafts = max_drafts
        self.fixed_k = fixed_k  # an operator's k for every batch; None: priced per batch
        self._lock = threading.Lock()
        self._tallies: dict[str, DraftTally] = {}
        self.last_k = 0  # the k the last drafting step chose

    def acceptance(self, seq: Sequence) -> float:
        """The sequence's running acceptance, shrunk towards its drafter's."""
        d = seq.draft
        assert d is not None
        prior = self.drafter_acceptance(d.drafter)
        return (d.accepted + PRIOR_WEIGHT * prior) / (d.drafted + PRIOR_WEIGHT)

    def drafter_acceptance(self, drafter: str) -> float:
        with self._lock:
            t = self._tallies.get(drafter, DraftTally())
        return (t.accepted + PRIOR_WEIGHT * PRIOR_ACCEPTANCE) / (t.drafted + PRIOR_WEIGHT)

    def record(self, drafter: str, drafted: int, accepted: int, seconds: float) -> None:
        """One verify of `drafted` drafts (the first rejected one counts) that kept
        `accepted` of them, and its share of the step's unembedding seconds."""
        if not drafted:
            return
        with self._lock:
            t = self._tallies.get(drafter, DraftTally())
            self._tallies[drafter] = DraftTally(
                t.drafted + drafted, t.accepted + accepted, t.verifies + 1,
                t.committed + accepted + 1, t.verify_seconds + seconds)

    def tallies(self) -> dict[str, DraftTally]:
        """Per drafter, with its break-even batch at its running acceptance."""
        with self._lock:
            tallies = dict(self._tallies)
        measured = self.costs.measured()
        out = {}
        for drafter, t in tallies.items():
            batches = sorted({b for (d, b, _) in measured if d == drafter})
            even = self.break_even(drafter, self.drafter_acceptance(drafter), batches)
            out[drafter] = dataclasses.replace(t, break_even_batch=even)
        return out

    def choose_k(self, drafters: str, batch: int, alphas: Seq[float]) -> int:
        """The k with the most tokens per second for a batch of `batch` sequences, the
        drafting ones (on `drafters`) with these acceptances; 0 (plain native steps)
        unless it wins."""
        if not alphas:
            return 0
        if self.fixed_k is not None:
            return self.fixed_k
        # A plain native step of this very batch is the baseline every k is judged
        # against: measure it first (one step) rather than guess it from other batches.
        plain = self.costs.measured().get((drafters, batch, batch))
        if plain is None:
            return 0
        draft = self.costs.predict(drafters, batch, 0)
        if draft is None:
            draft = PRIOR_DRAFT_SHARE * plain
        others = batch - len(alphas)  # plain native rows beside the drafters
        # Explore at most one doubling past the rows measured at this batch: each try
        # measures its verify, so a product that turns compute-bound is seen, not assumed.
        reach = 2 * measured_rows(self.costs, drafters, batch)
        rates = {}
        for k in range(1, self.max_drafts + 1):
            rows = others + len(alphas) * (k + 1)
            if rows > reach:
                break
            verify = self.costs.predict(drafters, batch, rows) or plain
            tokens = sum(expected_tokens(a, k) for a in alphas) + others * (k + 1)
            rates[k] = tokens / (k * draft + verify)
        if not rates:
            return 0
        best = max(rates, key=rates.__getitem__)
        # a near tie stays native: nothing to gain for the steps a rejection wastes
        return best if rates[best] > 1.02 * batch / plain else 0

    def break_even(self, drafters: str, alpha: float, batches: Seq[int]) -> int | None:
        """The smallest of `batches` at which drafting stops paying (k = 0) for sequences
        of acceptance alpha; None when it pays at every one."""
        for b in sorted(batches):
            if self.choose_k(drafters, b, [alpha] * b) == 0:
                return b
        return None

    def plan(self, seqs: list[Sequence]) -> None:
        """Before a step: put each drafting sequence on its drafter or on the native head.
        A sequence verifies when it has k drafts, when its last draft must not be extended,
        or when the step reads the native rows anyway (for a plain row or another verify)."""
        drafting = [s for s in seqs if s.draft is not None]
        if not drafting:
            return
        k = self.choose_k(drafters_of(seqs), len(seqs),
                          [self.acceptance(s) for s in drafting])
        self.last_k = k
        native = _native_of(drafting)
        native_anyway = any(s.draft is None and s.head == native for s in seqs)
        verify = [s.draft is not None and (s.draft.pending >= k or s.draft.verify_next)
                  for s in drafting]
        if native_anyway or any(verify):  # the native rows are read: verify every pending
            verify = [v or (s.draft is not None and s.draft.pending > 0)
                      for s, v in zip(drafting, verify, strict=True)]
        for s, v in zip(drafting, verify, strict=True):
            assert s.draft is not None
            s.head = s.draft.native if v else s.draft.drafter


def drafters_of(seqs: Seq[Sequence]) -> str:
    """The key of a batch's drafter heads in StepCosts."""
    return "+".join(sorted({s.draft.drafter for s in seqs if s.draft is not None}))


def _native_of(drafting: list[Sequence]) -> str:
    assert drafting[0].draft is not None
    return drafting[0].draft.native


def accepted_prefix(drafts: Seq[int], native: Seq[int]) -> int:
    """How many leading drafts equal the native tokens at their positions."""
    n = 0
    for d, t in zip(drafts, native, strict=False):
        if d != t:
            break
        n += 1
    return n

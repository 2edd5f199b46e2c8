"""Quality guard: wraps any policy and hides heads whose live prompt BPB is out of bounds.

Per head, the guard holds one of two states, `eligible` or `excluded`, through the same
Stabilizer the policies use: exclusion happens when the smoothed BPB exceeds the bound;
readmission only once it is below bound × (1 − margin) (hysteresis); either move waits for
`min_dwell_s` after the last one and counts against `max_switches_per_min`.

A head's own figure is stale once min_samples × (number of heads) newer samples went to
other heads. A stale figure never excludes a head. An excluded head gets no traffic, so
its figure always goes stale; the heads share one backbone and see the same traffic, so it
is then judged by the freshest head's BPB scaled by their manifest BPB ratio. That is how a
small head becomes eligible again when the traffic's quality is well inside its bound. If
every head is over its bound, the guard stands aside rather than route nowhere.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence

from router.policy.base import Policy
from router.policy.builtin import Choice
from router.policy.spec import GuardParams
from router.profiles import HeadProfile, RequestFeatures
from router.quality import HeadQuality
from router.stability import Clock, Stabilizer
from router.state import StateSnapshot

log = logging.getLogger(__name__)

ELIGIBLE, EXCLUDED = "eligible", "excluded"


class QualityGuard:
    def __init__(self, inner: Policy, params: GuardParams, clock: Clock = time.monotonic):
        self.inner = inner
        self.params = params
        self.name = inner.name
        self._clock = clock
        self._lock = threading.Lock()
        self._states: dict[str, Stabilizer] = {}

    def bound(self, head: HeadProfile) -> float | None:
        p = self.params
        absolute = p.bounds.get(head.name, p.max_bpb)
        relative = None if p.max_rel is None or head.bpb is None else head.bpb * (1 + p.max_rel)
        bounds = [b for b in (absolute, relative) if b is not None]
        return min(bounds) if bounds else None

    def excluded(self) -> frozenset[str]:
        with self._lock:
            return frozenset(h for h, s in self._states.items() if s.held == EXCLUDED)

    def decide(
        self, features: RequestFeatures, snapshot: StateSnapshot, profiles: Sequence[HeadProfile]
    ) -> Choice:
        excluded, notes = self.review(snapshot, profiles)
        eligible = [p for p in profiles if p.name not in excluded]
        if not eligible:
            notes.append("every head is over its bound, so none is excluded")
            eligible = list(profiles)
        c = self.inner.decide(features, snapshot, eligible)
        if not notes:
            return c
        return Choice(c.head, f"{c.reason}; guard: {'; '.join(notes)}", c.code, c.costs)

    def review(
        self, snapshot: StateSnapshot, profiles: Sequence[HeadProfile]
    ) -> tuple[frozenset[str], list[str]]:
        """Update each head's state from live BPB -> (excluded heads, notes for the record)."""
        manifest = {p.name: p.bpb for p in profiles if p.bpb is not None}
        excluded = self.excluded()
        notes: list[str] = []
        out = set()
        for p in profiles:
            state, note = self._review_head(p, snapshot, manifest, p.name in excluded)
            if state == EXCLUDED:
                out.add(p.name)
            if note:
                notes.append(note)
        return frozenset(out), notes

    def _review_head(
        self, p: HeadProfile, snapshot: StateSnapshot, manifest: Mapping[str, float],
        excluded: bool,
    ) -> tuple[str, str]:
        bound = self.bound(p)
        stale_after = self.params.min_samples * max(1, len(snapshot.quality))
        bpb, source, samples = estimate(p.name, snapshot.quality, manifest, stale_after,
                                        excluded)
        with self._lock:
            stab = self._states.get(p.name)
            if stab is None:
                # Every head starts eligible (no dwell, not counted), so a first exclusion is
                # a real move: it starts the dwell that readmission then waits out.
                stab = Stabilizer(self.params.min_dwell_s, self.params.max_switches_per_min,
                                  self._clock)
                stab.choose(ELIGIBLE, (ELIGIBLE,), lambda h: True)
                self._states[p.name] = stab
            few = samples < self.params.min_samples
            if bound is None or bpb is None or few:
                proposal = ELIGIBLE
            else:
                proposal = EXCLUDED if bpb > bound else ELIGIBLE
            readmit = bound is None or bpb is None or bpb < bound * (1 - self.params.margin)
            held = stab.held
            state, code = stab.choose(proposal, (ELIGIBLE, EXCLUDED),
                                      lambda h: h == ELIGIBLE or readmit)
        if few and code == "best":
            code = f"{samples}/{self.params.min_samples} samples"
        return state, _note(p.name, held, state, code, bpb, bound, source)


def estimate(head: str, quality: Mapping[str, HeadQuality], manifest: Mapping[str, float],
             stale_after: int, excluded: bool) -> tuple[float | None, str, int]:
    """Live BPB the guard judges `head` by -> (value, " est. from <head>" when borrowed, the
    samples behind it). None (no judgement) for an eligible head whose figure is stale."""
    own = quality.get(head, HeadQuality())
    latest = max((q.last_seq for q in quality.values()), default=0)
    if latest - own.last_seq < max(1, stale_after):
        return own.bpb, "", own.samples
    fresher = [(q.last_seq, h) for h, q in quality.items()
               if h != head and h in manifest and q.bpb is not None]
    if not excluded or head not in manifest or not fresher:
        return None, "", 0
    name = max(fresher)[1]
    src = quality[name]
    assert src.bpb is not None
    return src.bpb * manifest[head] / manifest[name], f" est. from {name}", src.samples


def _note(head: str, held: str | None, state: str, code: str, bpb: float | None,
          bound: float | None, source: str) -> str:
    if bpb is None or bound is None:
        return ""
    figure = f"bpb{source} {bpb:.2f}"
    if state == EXCLUDED and code == "best":  # newly excluded, or still over the bound
        return f"excluded {head} ({figure} > {bound:.2f})"
    if state == EXCLUDED:  # wanted back, but held by hysteresis, dwell or the flap cap
        return f"excluded {head} ({figure}, bound {bound:.2f}; readmission held: {code})"
    if held == EXCLUDED:
        return f"readmitted {head} ({figure} < {bound:.2f} less margin)"
    if bpb > bound:  # over the bound but kept: too few samples, hysteresis, dwell or flap cap
        return f"kept {head} ({figure} > {bound:.2f}; {code})"
    return ""

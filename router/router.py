"""The router: one decision per request under the active policy, which can be swapped live."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kernels.devices import DeviceSpec
from router.affinity import SessionAffinity
from router.compression import predict_all
from router.cost import AnalyticTimer, StepTimer
from router.decisions import DEFAULT_CAPACITY, DecisionLog
from router.errors import (
    HeadUnavailable,
    NoHeadHoldsIds,
    ReadingLacksLogits,
    RouterError,
    UnknownHead,
    VersionConflict,
)
from router.ladder_outcomes import stays_put
from router.policy.base import Decision, Policy, inputs_of
from router.policy.build import build_policy
from router.policy.builtin import Choice, live_batch
from router.policy.spec import PolicySpec, parse_policy
from router.profiles import HeadProfile, RequestFeatures
from router.segmentation import DEFAULT_FIT, PenaltyFit, excluded_by_bound, penalties
from router.stability import Clock
from router.state import LiveState, StateSnapshot

log = logging.getLogger(__name__)

RECENT_REQUESTS = 256  # decisions kept for policy dry runs
POLICY_HISTORY = 16  # previous policies kept for rollback


@dataclass(frozen=True, slots=True)
class _Active:
    # Swapped as one reference, so a reader never sees a policy with another's version.
    spec: PolicySpec
    policy: Policy
    version: int
    changed_by: str
    changed_at: float  # Unix time, s


class Router:
    def __init__(
        self,
        profiles: Sequence[HeadProfile],
        device: DeviceSpec,
        state: LiveState,
        policy_doc: Mapping[str, Any],
        timer: StepTimer | None = None,  # calibrated step times; default: the analytic model
        clock: Clock = time.monotonic,  # for dwell and switch caps; the simulator's sim time
        decision_log: int = DEFAULT_CAPACITY,
        quality_fit: PenaltyFit = DEFAULT_FIT,  # per-request BPB penalty model
        affinity: SessionAffinity | None = None,  # sessions stay on their head
        # The engine measures each request's loss on the two-level readings and moves it up
        # a ladder (heads.engine.quality_control): the predicted bound does not exclude them.
        measured_readings: bool = False,
    ) -> None:
        names = [p.name for p in profiles]
        if not names:
            raise RouterError("at least one head profile is required")
        if len(set(names)) != len(names):
            raise RouterError(f"duplicate head names in {names}")
        if set(state.heads) != set(names):
            raise RouterError(f"live state tracks {list(state.heads)}, profiles are {names}")
        self.profiles = tuple(profiles)
        self.device = device
        self.state = state
        self.timer: StepTimer = timer or AnalyticTimer(device)
        self.clock = clock
        self.quality_fit = quality_fit
        self.affinity = affinity or SessionAffinity()
        self.measured_readings = measured_readings
        self.decisions = DecisionLog(decision_log)
        self._heads = tuple(names)
        self._lock = threading.Lock()  # serializes writers; readers take self._active as is
        spec = parse_policy(policy_doc, self._heads)
        self._active = _Active(spec, self._build(spec), 1, "startup", time.time())
        self._history: deque[_Active] = deque(maxlen=POLICY_HISTORY)
        self._recent: deque[tuple[RequestFeatures, Decision]] = deque(maxlen=RECENT_REQUESTS)
        self._drained: frozenset[str] = frozenset()

    @property
    def heads(self) -> tuple[str, ...]:
        return self._heads

    @property
    def policy_doc(self) -> dict[str, Any]:
        return self._active.spec.to_doc()

    @property
    def version(self) -> int:
        return self._active.version

    @property
    def changed_by(self) -> str:
        return self._active.changed_by

    @property
    def changed_at(self) -> float:
        return self._active.changed_at

    @property
    def drained(self) -> frozenset[str]:
        return self._drained

    @property
    def can_rollback(self) -> bool:
        return bool(self._history)

    def set_policy(
        self, doc: Mapping[str, Any], actor: str, expected_version: int | None = None
    ) -> int:
        """Validate, then swap in the new policy atomically; returns the new version.

        With `expected_version`, the swap happens only if that version is still active.
        """
        spec = parse_policy(doc, self._heads)  # raises InvalidPolicy; nothing changes then
        return self._swap(spec, actor, expected_version)

    def rollback(self, actor: str, expected_version: int | None = None) -> int:
        """Re-activate the previous policy under a new version number."""
        if not self._history:
            raise RouterError("no previous policy to roll back to")
        return self._swap(self._history[-1].spec, actor, expected_version, rollback=True)

    def _build(self, spec: PolicySpec) -> Policy:
        return build_policy(spec, self.timer, self.clock)

    @property
    def quality_bound(self) -> float | None:
        """The active policy's max_bpb_loss; None: no per-request quality bound."""
        return getattr(self._active.spec.params, "max_bpb_loss", None)

    @property
    def spill_allowed(self) -> bool:
        return bool(getattr(self._active.spec.params, "spill", False))

    @property
    def active_policy(self) -> Policy:
        return self._active.policy

    @property
    def request_aware(self) -> bool:
        """Whether the active policy uses each request's own tokens: the gateway then
        tokenizes the prompt with every head before deciding."""
        active = self._active
        return (active.spec.name != "pinned"
                and getattr(active.spec.params, "features", "request") == "request")

    def _swap(
        self, spec: PolicySpec, actor: str, expected: int | None, rollback: bool = False
    ) -> int:
        policy = self._build(spec)
        with self._lock:
            old = self._active
            if expected is not None and expected != old.version:
                raise VersionConflict(expected, old.version)
            if rollback:
                self._history.pop()
            else:
                self._history.append(old)
            self._active = _Active(spec, policy, old.version + 1, actor, time.time())
        log.info("policy v%d set by %s: %s", old.version + 1, actor, spec.to_doc())
        return old.version + 1

    def adopt(self, doc: Mapping[str, Any], version: int, changed_by: str, changed_at: float,
              force: bool = False, keep_history: bool = True) -> bool:
        """Take a policy set elsewhere (another replica, the persisted store) under its own
        version, without bumping it; only if that version is newer than the active one
        (`force`: also an equal or older one). Returns whether it was adopted."""
        spec = parse_policy(doc, self._heads)
        policy = self._build(spec)
        with self._lock:
            old = self._active
            if not force and version <= old.version:
                return False
            if keep_history:
                self._history.append(old)
            self._active = _Active(spec, policy, version, changed_by, changed_at)
        log.info("policy v%d (set by %s) adopted: %s", version, changed_by, spec.to_doc())
        return True

    def set_drained(self, head: str, drained: bool) -> None:
        """Take a head out of routing (or back in); requests already routed keep running."""
        if head not in self._heads:
            raise UnknownHead(head, self._heads)
        with self._lock:
            self._drained = self._drained | {head} if drained else self._drained - {head}

    def recent(self, n: int = RECENT_REQUESTS) -> list[tuple[RequestFeatures, Decision]]:
        return list(self._recent)[-n:] if n > 0 else []

    def dry_run(self, doc: Mapping[str, Any], n: int = RECENT_REQUESTS) -> list[Decision]:
        """Decisions a candidate policy would make on the last `n` requests, at today's state."""
        spec = parse_policy(doc, self._heads)
        policy = self._build(spec)
        out = []
        for features, _ in self.recent(n):
            pinned = features.pinned_head
            if pinned is not None:
                out.append(Decision(pinned, "request_pin", 0, "request pin", {}))
                continue
            profiles = self._routable()
            c = policy.decide(features, self.state.snapshot(), profiles)
            out.append(Decision(c.head, spec.name, 0, c.reason, c.costs, c.code))
        return out

    def _routable(self, min_vocab: int = 0, needs_logits: bool = False
                  ) -> tuple[HeadProfile, ...]:
        drained = self._drained
        profiles = tuple(p for p in self.profiles if p.name not in drained)
        if not profiles:
            raise HeadUnavailable("every head is drained")
        holding = tuple(p for p in profiles if p.vocab_size >= min_vocab
                        and not (needs_logits and p.reads is not None))
        if not holding:
            raise NoHeadHoldsIds(min_vocab)
        return holding

    def preview(self, features: RequestFeatures) -> Decision:
        """What the active policy would choose for `features`, recording nothing and moving
        no policy state: a fresh instance of the policy decides (no held head to keep)."""
        return self._decide(features, self._build(self._active.spec), remember=False)[0]

    def decide(self, features: RequestFeatures) -> Decision:
        decision, features = self._decide(features)
        self._recent.append((features, decision))
        self.decisions.append(decision)
        return decision

    def routable(self) -> tuple[str, ...]:
        return tuple(p.name for p in self._routable())

    def spill(self, decision: Decision, head: str, why: str) -> Decision:
        """Record that admission moved a request off its chosen head (policy allows spill)."""
        if head not in self._heads:
            raise UnknownHead(head, self._heads)
        moved = Decision(head, decision.policy, decision.version,
                         f"spill: {why}; was {decision.head} ({decision.reason})",
                         decision.costs, "spill", decision.inputs, time.time(), decision.request)
        self.decisions.append(moved)
        return moved

    def _decide(self, features: RequestFeatures, policy: Policy | None = None,
                remember: bool = True) -> tuple[Decision, RequestFeatures]:
        active = self._active
        if features.pinned_head is not None:
            if features.pinned_head not in self._heads:
                raise UnknownHead(features.pinned_head, self._heads)
            if features.pinned_head in self._drained:
                raise HeadUnavailable(f"head {features.pinned_head} is drained")
            reason = (
                f"request pinned {features.pinned_head}; overrides the {active.spec.name} policy"
            )
            snap = self.state.snapshot()
            return Decision(features.pinned_head, "request_pin", active.version, reason, {},
                            "request_pin", inputs_of(snap, live_batch(snap)), time.time(),
                            request_record(features)), features
        profiles = self._routable(features.min_vocab, features.needs_logits)
        snap = self.state.snapshot()
        features = self._predict(features, snap, profiles, active.spec)
        c = (policy or active.policy).decide(features, snap, profiles)
        if c.head in self._drained:  # a pinned policy whose head an operator drained
            raise HeadUnavailable(f"policy {active.spec.name} routes to drained head {c.head}")
        if all(p.name != c.head for p in profiles):  # a pinned policy's head lacks the ids
            if features.needs_logits and any(p.name == c.head and p.reads is not None
                                             for p in self.profiles):
                raise ReadingLacksLogits(c.head)
            raise NoHeadHoldsIds(features.min_vocab)
        if c.head in features.excluded:  # a policy that does not price requests itself
            c = _within_bound(c, features, profiles)
        if features.session is not None:
            c = self._affine(c, features, profiles, remember)
        drafter = self._drafter(c.head, active.spec)
        if drafter is not None:  # exact: the native head writes, a reading drafts
            native = self._native().name
            c = Choice(native, f"max_bpb_loss 0: the native head {native} writes every token "
                               f"and {drafter} drafts them for it to verify (the policy chose "
                               f"{c.head}: {c.reason})", "exact", c.costs)
        return Decision(c.head, active.spec.name, active.version, c.reason, c.costs, c.code,
                        inputs_of(snap, live_batch(snap)), time.time(),
                        request_record(features),
                        () if drafter else self._ladder(c.head, active.spec),
                        drafter, c.head not in features.unmeasured), features

    def _native(self) -> HeadProfile:
        return max((p for p in self.profiles if p.reads is None), key=lambda p: p.vocab_size)

    def _drafter(self, head: str, spec: PolicySpec) -> str | None:
        """Under a zero quality bound, where the engine measures readings: the reading that
        drafts for the native head (heads.engine.drafting), the chosen one when the policy
        chose a reading, else the cheapest routable one; None otherwise."""
        if not self.measured_readings or spec.name == "pinned" \
                or getattr(spec.params, "max_bpb_loss", None) != 0:
            return None
        native = self._native()
        readings = sorted((p for p in self.profiles if p.reads is not None
                           and p.name not in self._drained), key=lambda p: p.vocab_size)
        if native.name in self._drained or not readings:
            return None
        by_name = {p.name: p for p in readings}
        return head if head in by_name else readings[0].name

    def _ladder(self, head: str, spec: PolicySpec) -> tuple[str, ...]:
        """`head` and the routable native-stream heads above it, up to the native head, when
        the engine measures readings and the policy has a quality bound to hold."""
        by_name = {p.name: p for p in self.profiles}
        if not self.measured_readings or by_name[head].reads is None \
                or spec.name == "pinned" or getattr(spec.params, "max_bpb_loss", None) is None:
            return ()
        native = self._native()
        if native.name in self._drained:
            return ()
        above = sorted((p for p in self.profiles if p.reads is not None
                        and p.vocab_size > by_name[head].vocab_size
                        and p.name not in self._drained), key=lambda p: p.vocab_size)
        return (head, *(p.name for p in above), native.name)

    def _affine(self, c: Choice, features: RequestFeatures, profiles: Sequence[HeadProfile],
                remember: bool) -> Choice:
        """Keep the session on its last head while that head is routable and within the
        request's quality bound (router.affinity)."""
        assert features.session is not None
        held = self.affinity.head(features.session)
        routable = {p.name for p in profiles}
        if held is not None and held != c.head and held in routable \
                and held not in features.excluded:
            c = Choice(held, f"session affinity: kept {held}, which holds this conversation's "
                             f"prefix cache; the policy chose {c.head} ({c.reason})",
                       "affinity", c.costs)
        if remember:
            self.affinity.remember(features.session, c.head)
        return c

    def _predict(self, features: RequestFeatures, snap: StateSnapshot,
                 profiles: Sequence[HeadProfile], spec: PolicySpec) -> RequestFeatures:
        """Each head's predicted output bytes/token and BPB penalty for this request, and the
        heads its quality bound excludes; content-blind policies see none of it."""
        if not features.tokens:
            return features
        if not self.request_aware:
            return dataclasses.replace(features, tokens={}, script="unknown")
        pen = penalties(self.profiles, features, self.quality_fit)
        bound = getattr(spec.params, "max_bpb_loss", None)
        routable = {p.name for p in profiles}
        excluded = excluded_by_bound({h: v for h, v in pen.items() if h in routable}, bound)
        unmeasured: frozenset[str] = frozenset()
        if self.measured_readings:  # measured per request by the engine instead
            readings = {p.name for p in self.profiles if p.reads is not None}
            excluded = {h: v for h, v in excluded.items() if h not in readings}
            unmeasured = frozenset(r for r in readings if stays_put(
                snap.ladders, r, features.script, pen.get(r)))
        return dataclasses.replace(
            features, bpb_penalty=pen, excluded=excluded, unmeasured=unmeasured,
            predicted_bpt=predict_all(self.profiles, features, snap.output_bytes,
                                      snap.output_tokens))


def _within_bound(c: Choice, features: RequestFeatures,
                  profiles: Sequence[HeadProfile]) -> Choice:
    """Move a choice off a head the quality bound excludes: to the cheapest head the policy
    priced, else to the head with the smallest predicted penalty."""
    eligible = [p.name for p in profiles if p.name not in features.excluded]
    if not eligible:
        return c
    priced = [h for h in eligible if h in c.costs]
    head = (min(priced, key=c.costs.__getitem__) if priced
            else min(eligible, key=lambda h: features.bpb_penalty.get(h, 0.0)))
    loss = features.excluded[c.head]
    return Choice(head, f"{c.reason}; quality bound: {c.head} predicted {loss:+.0%} BPB over "
                        f"the best head, so {head}", "quality_bound", c.costs)


def request_record(f: RequestFeatures) -> dict[str, Any]:
    """What the decision record shows of the request: per head, its prompt tokens, bytes/token,
    byte-fallback share, predicted output bytes/token and BPB penalty; excluded heads."""
    heads = {}
    for h, t in f.tokens.items():
        bpt = f.prompt_bpt(h)
        heads[h] = {"prompt_tokens": t.prompt_tokens,
                    "prompt_bytes_per_token": None if bpt is None else round(bpt, 4),
                    "fallback_share": round(f.fallback_share(h), 4),
                    "predicted_bytes_per_token": round(f.predicted_bpt[h], 4)
                    if h in f.predicted_bpt else None,
                    "bpb_penalty": round(f.bpb_penalty[h], 4) if h in f.bpb_penalty else None}
    return {"prompt_bytes": f.prompt_bytes, "max_tokens": f.max_tokens, "script": f.script,
            "session": f.session is not None, "heads": heads, "excluded": dict(f.excluded)}

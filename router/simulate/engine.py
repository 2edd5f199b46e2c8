"""A discrete-event model of the serving engine, driving the real Router and Admission.

Each iteration is one engine step: requests that arrived by now are routed (Router.decide
on the live state this engine reports, clock = simulated time) and admitted (Admission with
the device's KV budget; the rest wait FIFO); newly admitted ones are prefilled; then every
running request decodes one token. The step's time comes from a cost model
(`StepTimer.step_time` over the head groups, plus a prefill term). Idle time is skipped and
not charged: cost is busy device-seconds per MB of output.

Two timers: the router decides with `timer`, and steps are charged by `score_timer`
(default: the same). Scoring a policy with the timer it minimizes flatters it by
construction; `polyhead simulate --calibration` charges measured step times instead.

With `texts` (language -> head -> how that head spells the language), each request is
tokenized per head as the gateway would, so request-aware policies see its own bytes/token
and byte-fallback share, and every head decodes the request's output at its own rate.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from router.admission import Admission, KVBudget, OutputRatio
from router.cost import Group, StepTimer, prefill_s
from router.profiles import HeadProfile, HeadTokens, RequestFeatures
from router.router import Router
from router.simulate.traces import SimRequest
from router.state import LiveState

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Seq:
    head: str
    arrival_s: float
    prompt_tokens: int
    out_tokens: int
    out_bytes: int
    max_tokens: int
    lang: str = "en"
    ticket: Any = None


@dataclass(slots=True)
class SimResult:
    policy: str
    device_s: float = 0.0  # busy step time
    output_bytes: int = 0
    latencies: list[float] = field(default_factory=list)
    requests: dict[str, int] = field(default_factory=dict)  # head -> requests served
    switches: int = 0  # consecutive routing decisions that changed head
    steps: int = 0
    max_batch: int = 0

    @property
    def cost_s_per_mb(self) -> float:
        return self.device_s / (self.output_bytes / 1e6) if self.output_bytes else math.inf

    def latency(self, q: float) -> float:
        if not self.latencies:
            return math.nan
        ranked = sorted(self.latencies)
        return ranked[min(len(ranked) - 1, math.ceil(q * len(ranked)) - 1)]

    def share(self) -> dict[str, float]:
        total = sum(self.requests.values()) or 1
        return {h: n / total for h, n in self.requests.items()}


@dataclass(frozen=True, slots=True)
class Spelling:
    """How one head spells one language's text."""

    bytes_per_token: float
    fallback_share: float = 0.0  # of the bytes, spelled with byte-fallback tokens


Texts = Mapping[str, Mapping[str, Spelling]]  # language -> head -> spelling


class SimEngine:
    def __init__(self, profiles: Sequence[HeadProfile], timer: StepTimer,
                 policy_doc: Mapping[str, Any], kv_tokens: int, max_num_seqs: int = 256,
                 lambda_forecast: float | None = None, block_size: int = 16,
                 score_timer: StepTimer | None = None, texts: Texts | None = None) -> None:
        self.profiles = {p.name: p for p in profiles}
        self.timer = score_timer or timer  # what steps cost
        self.texts = texts or {}
        for lang, spell in self.texts.items():
            if missing := set(self.profiles) - set(spell):
                raise ValueError(f"texts[{lang!r}] does not spell heads {sorted(missing)}")
        self.now = 0.0
        self.state = LiveState.for_profiles(profiles, window_s=5.0)
        self.state.set_lambda_forecast(lambda_forecast)
        self.router = Router(profiles, timer.device, self.state, policy_doc, timer=timer,
                             clock=lambda: self.now, decision_log=64)
        self.admission = Admission(profiles, KVBudget(max(1, kv_tokens // block_size),
                                                      block_size, max_num_seqs),
                                   OutputRatio(), clock=lambda: self.now)
        self.max_num_seqs = max_num_seqs
        self.waiting: deque[_Seq] = deque()
        self.running: list[tuple[int, int, _Seq]] = []  # heap of (finish step, id, seq)
        self.ctx_sum: dict[str, int] = dict.fromkeys(self.profiles, 0)  # KV tokens per head
        self.count: dict[str, int] = dict.fromkeys(self.profiles, 0)
        self.step = 0
        self._ids = itertools.count()

    def _route(self, r: SimRequest, result: SimResult, last: list[str | None]) -> None:
        loads = {h: (n, 0) for h, n in self.count.items()}
        for s in self.waiting:
            loads[s.head] = (loads[s.head][0], loads[s.head][1] + 1)
        self.state.set_loads(loads, now=self.now)
        spell = self.texts.get(r.lang)
        if spell is None:
            features = RequestFeatures(r.prompt_bytes, r.max_tokens)
        else:
            tokens = {h: HeadTokens(max(1, math.ceil(r.prompt_bytes / x.bytes_per_token)),
                                    round(x.fallback_share * r.prompt_bytes))
                      for h, x in spell.items()}
            features = RequestFeatures(r.prompt_bytes, r.max_tokens, None, tokens, r.lang)
        d = self.router.decide(features)
        if last[0] is not None and d.head != last[0]:
            result.switches += 1
        last[0] = d.head
        bpt = spell[d.head].bytes_per_token if spell else self.profiles[d.head].bpt
        out = min(r.max_tokens, max(1, math.ceil(r.output_bytes / bpt)))
        text = r.output_bytes if out < r.max_tokens else int(out * bpt)
        self.admission.observe_request(r.prompt_bytes, r.max_tokens)
        self.waiting.append(_Seq(d.head, r.arrival_s, max(1, math.ceil(r.prompt_bytes / bpt)),
                                 out, text, r.max_tokens, r.lang))

    def _admit(self) -> float:
        """Admit waiting requests FIFO while KV and the sequence cap allow; -> prefill time."""
        spent = 0.0
        while self.waiting and len(self.running) < self.max_num_seqs:
            s = self.waiting[0]
            blocks = self.admission.footprint_blocks(s.head, s.prompt_tokens, s.max_tokens)
            ticket = self.admission.try_admit(s.head, blocks)
            if ticket is None:
                break
            self.waiting.popleft()
            s.ticket = ticket
            heapq.heappush(self.running, (self.step + s.out_tokens, next(self._ids), s))
            self.ctx_sum[s.head] += s.prompt_tokens
            self.count[s.head] += 1
            spent += prefill_s(self.profiles[s.head], self.timer, s.prompt_tokens)
        return spent

    def run(self, trace: Sequence[SimRequest], label: str) -> SimResult:
        result = SimResult(label, requests=dict.fromkeys(self.profiles, 0))
        last: list[str | None] = [None]
        i = 0
        while i < len(trace) or self.waiting or self.running:
            if not self.running and not self.waiting and trace[i].arrival_s > self.now:
                self.now = trace[i].arrival_s  # idle: jump to the next arrival
            while i < len(trace) and trace[i].arrival_s <= self.now:
                self._route(trace[i], result, last)
                i += 1
            dt = self._admit()
            groups = [Group(self.profiles[h], n, self.ctx_sum[h] / n)
                      for h, n in self.count.items() if n]
            if groups:
                dt += self.timer.step_time(groups)
                result.max_batch = max(result.max_batch, len(self.running))
            elif not dt:
                if i < len(trace):
                    self.now = max(self.now, trace[i].arrival_s)
                continue
            self.now += dt
            result.device_s += dt
            self.step += 1
            result.steps += 1
            for h, n in self.count.items():
                self.ctx_sum[h] += n
            while self.running and self.running[0][0] <= self.step:
                _, _, s = heapq.heappop(self.running)
                self._finish(s, result)
        return result

    def _finish(self, s: _Seq, result: SimResult) -> None:
        self.count[s.head] -= 1
        self.ctx_sum[s.head] -= s.prompt_tokens + s.out_tokens
        self.admission.release(s.ticket, s.out_tokens, s.max_tokens)
        result.latencies.append(self.now - s.arrival_s)
        result.output_bytes += s.out_bytes
        result.requests[s.head] += 1
        self.state.add_output(s.head, s.lang, s.out_bytes, s.out_tokens)

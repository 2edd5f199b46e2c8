"""Replay an arrival trace through the real Router and the real local engine, in process.

Per request, as server/gateway/gateway.py does: the engine's live per-head load -> LiveState ->
the prompt tokenized with every head -> Router.decide -> LocalEngine.generate on the chosen
head's ids; finished requests feed the live output compression. Arrivals follow the trace's
clock in real time. Each request is a slice of its language's held-out sample
(server.bench.replay.prompts): the prompt, and the text that follows it, `output_bytes` long. That
continuation, tokenized by the serving head, sets how many tokens the request decodes
(greedy, no stop tokens): the same text costs each head its own number of steps. Measured
cost is busy engine time (the engine's own step timings, prefill + decode) per MB of
detokenized output text; idle time is not charged. KV admission is the engine scheduler's
(it queues what does not fit); the gateway's AdmissionGate and its 429s are not exercised.

A trace runs open loop (arrivals on its clock) or, at a load level, closed loop: `concurrency`
clients, each sending the trace's next request as soon as its last one finished, so the level
holds about that many requests in flight whatever the heads' speed. Prompts are scored for
live BPB as the gateway's default does (a seeded 10% of requests, 32 positions), so the
replay pays what serving pays; that time is inside the prefill steps and reported apart.

Served quality is scored after the runs (`score`): the continuation's bits per byte given
the prompt, under the head that served the request.

A run may instead send every request to another backend (`run(backend=...)`): stock vLLM
serving the native head is what an operator runs without polyhead. The same trace, texts,
router path and token counts apply (its `min_tokens` holds it to the same length past an
EOS); it scores no prompts, and as its steps are not visible here it is charged the wall
time it had requests in flight (`ReplayResult.inflight_s`), which every run reports alike.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from heads.engine.config import EngineConfig
from heads.engine.grouped_reading import GroupedReading
from heads.engine.llm_engine import LocalEngine
from heads.engine.types import (
    NO_LOGIT_RULES,
    GenerationRequest,
    LogitRules,
    QualityLadder,
    StepTiming,
    TokenEvent,
)
from heads.model.weights import Checkpoint
from heads.vocab.prompt_encoder import PromptEncoder
from kernels.row_params import RowParams
from router.cost import StepTimer
from router.profiles import HeadProfile, HeadTokens, RequestFeatures
from router.router import Router
from router.simulate.engine import SimResult
from router.simulate.traces import SimRequest
from router.state import LiveState
from router.step_time_fit import FittedStepTimer, StepSample
from server.backends.base import Backend
from server.bench.replay.prompts import for_language
from server.bench.replay.quality import continuation_token_bits
from server.gateway.prompt_bpb import PromptBpbConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    max_num_seqs: int = 32
    kv_cache_mb: int = 512
    lambda_forecast: float | None = 100.0  # as `polyhead simulate --lambda`
    batch_window_s: float = 5.0  # live-B smoothing, as the gateway's default
    poll_s: float = 0.1  # step timings are drained and stamped with trace time this often
    prompt_bpb: PromptBpbConfig = PromptBpbConfig()  # which prompts the engine scores
    # As the gateway's quality_control=measured: readings laddered by measured loss.
    measured_quality: bool = True
    positions: int = 64  # the gateway's quality_positions
    probe_every: int = 8  # and quality_probe_every


@dataclass(frozen=True, slots=True)
class Served:
    """One replayed request: where it went and what it produced."""

    index: int  # position in the trace
    lang: str
    head: str  # the head routed to; the last one when a ladder moved the request
    tokens: int  # output tokens decoded
    text_bytes: int  # UTF-8 bytes of their text
    predicted_bpt: float | None  # the router's output bytes/token prediction on `head`
    prompt_bpt: float | None  # the prompt's own bytes/token on `head`
    latency_s: float
    # A laddered request's heads: (first output token on it, head), in order; () unladdered.
    spans: tuple[tuple[int, str], ...] = ()

    @property
    def heads(self) -> set[str]:
        """The heads whose scores its served quality reads."""
        return {h for _, h in self.spans} or {self.head}


@dataclass(slots=True)
class ReplayResult:
    result: SimResult  # the simulator's fields, measured
    regime_s: dict[str, float] = field(default_factory=dict)  # busy step seconds per regime
    regime_tokens: dict[tuple[str, str], int] = field(default_factory=dict)  # (regime, head)
    head_tokens: dict[str, int] = field(default_factory=dict)  # output tokens per head
    head_bytes: dict[str, int] = field(default_factory=dict)  # output text bytes per head
    decode_steps: list[StepSample] = field(default_factory=list)  # for calibration
    served: list[Served] = field(default_factory=list)  # one per request, in arrival order
    head_s: dict[str, float] = field(default_factory=dict)  # step seconds, by token share
    bpb: list[float] = field(default_factory=list)  # per served request, once scored
    # Where the run's time went (server.bench.replay.breakdown), seconds.
    prefill_s: float = 0.0  # prefill steps, prompt scoring included
    decode_s: float = 0.0  # decode steps
    decode_rows: int = 0  # Σ rows over decode steps: ÷ decode steps = mean running batch
    decode_step_count: int = 0
    score_s: float = 0.0  # prompt scoring (inside prefill steps)
    measure_s: float = 0.0  # measured quality control's prompt measurement (inside prefill)
    probe_s: float = 0.0  # and its decode probes (inside decode steps)
    wall_s: float = 0.0  # first request sent to last one finished
    inflight_s: float = 0.0  # wall time with at least one request in flight
    head_decode: dict[str, tuple[float, int]] = field(default_factory=dict)  # s, rows

    @property
    def mean_batch(self) -> float:
        """Mean running batch: rows per decode step."""
        return self.decode_rows / self.decode_step_count if self.decode_step_count else 0.0

    def head_cost_per_token(self, head: str) -> float:
        """Busy step seconds per token the head's rows took, prefill steps included."""
        n = sum(v for (_, h), v in self.regime_tokens.items() if h == head)
        return self.head_s.get(head, 0.0) / n if n else 0.0

    def regime_cost(self, regime: str) -> float:
        """Device-s per MB in one regime: its step time over its tokens × measured B/token."""
        mb = sum(n * self.head_bytes[h] / max(1, self.head_tokens[h])
                 for (r, h), n in self.regime_tokens.items() if r == regime) / 1e6
        return self.regime_s.get(regime, 0.0) / mb if mb else math.inf


class Replayer:
    """One engine for every run (the engine is policy-agnostic); a fresh router per run."""

    def __init__(self, ckpt: Checkpoint, profiles: Sequence[HeadProfile], cfg: ReplayConfig,
                 timer: Callable[[], StepTimer]) -> None:
        self.ckpt, self.cfg, self.new_timer = ckpt, cfg, timer
        self.profiles = {p.name: p for p in profiles}
        self.engine = LocalEngine(ckpt.model, EngineConfig(
            kv_cache_bytes=cfg.kv_cache_mb << 20, max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=4096), readings=GroupedReading.served(ckpt))
        self.encoder = PromptEncoder(ckpt.tokenizers,
                                     {h.name: h.bos_token_id for h in ckpt.manifest.heads})
        # (index, head) -> (bits per continuation token [n], continuation bytes)
        self._bits: dict[tuple[int, str], tuple[torch.Tensor, int]] = {}

    @property
    def kv_tokens(self) -> int:
        return self.engine.total_blocks() * self.engine.config.block_size

    async def warm_up(self) -> None:
        """One short request per head: first-step allocations are not charged to a run."""
        await self.engine.start()
        for h in self.profiles:
            ids = self.encoder.encode([for_language("en").text(64)], False, [h]).heads[h].ids[0]
            await self._generate(h, list(ids), 4)
        self.engine.drain_step_timings()

    async def close(self) -> None:
        self.encoder.close()
        await self.engine.shutdown()

    async def _generate(self, head: str, ids: list[int], n: int, score: bool = False,
                        positions: int = 0, backend: Backend | None = None,
                        ladder: QualityLadder | None = None,
                        drafter: str | None = None) -> list[TokenEvent]:
        # The local engine has no stop ids here, so it decodes n tokens; another backend may
        # stop at the model's EOS unless held to n by min_tokens.
        req = GenerationRequest(f"replay-{time.perf_counter_ns()}", head, tuple(ids), n,
                                RowParams(temperature=0.0), frozenset(),
                                score_prompt=score, score_positions=positions,
                                rules=LogitRules(min_tokens=n) if backend else NO_LOGIT_RULES,
                                ladder=ladder, drafter=None if backend else drafter)
        events = (backend or self.engine).generate(req)
        return [e async for e in events]

    def texts(self, r: SimRequest, index: int) -> tuple[str, str]:
        return for_language(r.lang).pair(r.prompt_bytes, r.output_bytes, index)

    async def run(self, trace: Sequence[SimRequest], policy_doc: Mapping[str, Any], label: str,
                  regime_of: Callable[[float], str], concurrency: int | None = None,
                  backend: Backend | None = None) -> ReplayResult:
        """`concurrency`: closed loop with that many clients; None: the trace's arrivals.
        `backend`: serve on it instead of the local engine (the policy must pick a head it
        serves)."""
        profiles = list(self.profiles.values())
        timer = self.new_timer()
        state = LiveState.for_profiles(profiles, self.cfg.batch_window_s)
        state.set_lambda_forecast(self.cfg.lambda_forecast)
        router = Router(profiles, timer.device, state, policy_doc, timer=timer,
                        measured_readings=self.cfg.measured_quality and backend is None)
        out = ReplayResult(SimResult(label, requests=dict.fromkeys(self.profiles, 0)),
                           head_tokens=dict.fromkeys(self.profiles, 0),
                           head_bytes=dict.fromkeys(self.profiles, 0))
        spans: list[tuple[float, float]] = []  # (sent, finished) per request, trace time
        score0 = self.engine.prompt_score_seconds()
        measure0, probe0 = self.engine.quality_seconds()
        t0 = time.perf_counter()
        clock = lambda: time.perf_counter() - t0  # noqa: E731 - trace time, s

        def drain() -> None:
            now = clock()
            for t in self.engine.drain_step_timings():
                _account(out, t, regime_of(now), timer)

        async def poll() -> None:
            while True:
                await asyncio.sleep(self.cfg.poll_s)
                drain()

        async def serve(r: SimRequest, index: int, sent: float) -> Served:
            loads = (backend or self.engine).head_load()
            state.set_loads({h: (x.running, x.waiting) for h, x in loads.items()})
            prompt, continuation = self.texts(r, index)
            enc = self.encoder.encode([prompt], chat=False)
            tokens = {h: HeadTokens(p.tokens, p.fallback_bytes) for h, p in enc.heads.items()}
            d = router.decide(RequestFeatures(enc.prompt_bytes, r.max_tokens, None, tokens,
                                              enc.script))
            if last[0] is not None and d.head != last[0]:
                out.result.switches += 1
            last[0] = d.head
            # The continuation in this head's tokens: what writing that text costs it.
            n = len(self.ckpt.tokenizers[d.head].encode(continuation))
            n = min(r.max_tokens, max(1, n))
            # The same requests are scored under every label (seeded by position).
            scored, positions = self.cfg.prompt_bpb.request(None, random.Random(index))
            scored = (scored and backend is None  # stock serving scores nothing
                      and self.ckpt.manifest.head(d.head).reads is None)  # as the gateway
            bound = router.quality_bound
            ladder = (QualityLadder(d.ladder, bound, positions=self.cfg.positions,
                                    probe_every=self.cfg.probe_every)
                      if d.ladder and bound is not None else None)
            events = await self._generate(d.head, list(enc.heads[d.head].ids[0]), n,
                                          scored, positions, backend, ladder, d.drafter)
            out_ids = [e.token_id for e in events]
            tok = self.ckpt.tokenizers[d.head]  # every rung of a ladder spells native ids
            text = len(tok.decode(out_ids).encode())
            spans.append((sent, clock()))
            latency = clock() - sent
            out.result.latencies.append(latency)
            out.result.output_bytes += text
            heads = [e.head or d.head for e in events]
            final = heads[-1] if heads else d.head
            out.result.requests[final] += 1
            for h in set(heads):  # tokens and their bytes, to the head that sampled them
                mine = [t for t, x in zip(out_ids, heads, strict=True) if x == h]
                out.head_tokens[h] += len(mine)
                out.head_bytes[h] += round(text * len(mine) / len(out_ids))
            state.add_served(d.head, enc.prompt_bytes + text,
                             enc.heads[d.head].tokens + len(out_ids))
            if out_ids:
                state.add_output(d.head, enc.script, text, len(out_ids))
            seen = d.request.get("heads", {}).get(d.head, {})
            return Served(index, r.lang, final, len(out_ids), text,
                          seen.get("predicted_bytes_per_token"),
                          seen.get("prompt_bytes_per_token"), latency,
                          _spans(heads) if ladder is not None else ())

        async def client(r: SimRequest, index: int) -> Served:
            async with slots:  # FIFO: requests go out in trace order
                return await serve(r, index, clock())

        last: list[str | None] = [None]
        slots = asyncio.Semaphore(concurrency or 1)
        poller = asyncio.create_task(poll())
        tasks = []
        for i, r in enumerate(trace):
            if concurrency is None:
                await asyncio.sleep(max(0.0, r.arrival_s - clock()))
                tasks.append(asyncio.create_task(serve(r, i, r.arrival_s)))
            else:
                tasks.append(asyncio.create_task(client(r, i)))
        try:
            out.served = list(await asyncio.gather(*tasks))
        finally:
            poller.cancel()
        drain()
        out.score_s = self.engine.prompt_score_seconds() - score0
        measure1, probe1 = self.engine.quality_seconds()
        out.measure_s, out.probe_s = measure1 - measure0, probe1 - probe0
        out.wall_s = max(end for _, end in spans) - min(start for start, _ in spans)
        out.inflight_s = _union(spans)
        return out

    def score(self, trace: Sequence[SimRequest], pairs: set[tuple[int, str]]) -> None:
        """Bits of each continuation token of each (request, head), given its prompt, cached."""
        for index, head in sorted(pairs - set(self._bits)):
            prompt, continuation = self.texts(trace[index], index)
            self._bits[index, head] = (
                continuation_token_bits(self.ckpt, head, prompt, continuation),
                len(continuation.encode()))

    def served_bpb(self, served: Served) -> float:
        """Each continuation token scored under the head that served its position; past the
        output, under the last head (a ladder's rungs spell the same native tokens)."""
        spans = served.spans or ((0, served.head),)
        n = self._bits[served.index, spans[0][1]][1]
        total = 0.0
        for (start, head), nxt in zip(spans, (*spans[1:], (None, "")), strict=True):
            bits = self._bits[served.index, head][0]
            total += float(bits[start:nxt[0]].sum())
        return total / n if n else math.nan


def _account(out: ReplayResult, t: StepTiming, regime: str, timer: StepTimer) -> None:
    if isinstance(timer, FittedStepTimer):  # live calibration, as the gateway does
        timer.record_step(t)
    out.result.device_s += t.seconds
    out.result.steps += 1
    out.regime_s[regime] = out.regime_s.get(regime, 0.0) + t.seconds
    rows = sum(n for _, n, _ in t.groups) or 1
    for head, n, _ in t.groups:  # every step, prefill included, samples one token per row
        key = (regime, head)
        out.regime_tokens[key] = out.regime_tokens.get(key, 0) + n
        out.head_s[head] = out.head_s.get(head, 0.0) + t.seconds * n / rows
    if t.prefill:
        out.prefill_s += t.seconds
    else:
        out.decode_s += t.seconds
        out.decode_rows += rows
        out.decode_step_count += 1
        for head, n, _ in t.groups:  # step time split by rows, as head_s
            s, r = out.head_decode.get(head, (0.0, 0))
            out.head_decode[head] = (s + t.seconds * n / rows, r + n)
        out.result.max_batch = max(out.result.max_batch, sum(n for _, n, _ in t.groups))
        out.decode_steps.append(StepSample(t.groups, t.seconds))


def _spans(heads: Sequence[str]) -> tuple[tuple[int, str], ...]:
    """(first token index, head) of each run of one head in a request's output."""
    return tuple((i, h) for i, h in enumerate(heads) if i == 0 or heads[i - 1] != h)


def _union(spans: Sequence[tuple[float, float]]) -> float:
    """Total length of the union of [start, end) intervals."""
    total, reach = 0.0, -math.inf
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total

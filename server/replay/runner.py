"""Replay an arrival trace through the real Router and the real local engine, in process.

Per request, as server/service.py does: the engine's live per-head load -> LiveState ->
Router.decide -> tokenize with the chosen head -> LocalEngine.generate. Arrivals follow the
trace's clock in real time. Like the simulator, a request's output text (bytes) becomes each
head's token budget through the manifest's bytes/token; generation is greedy with no stop
tokens, so every request decodes exactly that budget. Measured cost is busy engine time (the
engine's own step timings, prefill + decode) per MB of detokenized output text; idle time is
not charged. KV admission is the engine scheduler's (it queues what does not fit); the
gateway's AdmissionGate and its 429s are not exercised.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from heads.checkpoint import Checkpoint
from heads.engine.config import EngineConfig
from heads.engine.llm_engine import GenerationRequest, LocalEngine, StepTiming
from kernels.sampling_params import RowParams
from router.calibration import CalibratedTimer, StepSample
from router.cost import StepTimer
from router.profiles import HeadProfile, RequestFeatures
from router.router import Router
from router.simulate.engine import SimResult
from router.simulate.traces import SimRequest
from router.state import LiveState
from server.replay.prompts import PromptText

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    max_num_seqs: int = 32
    kv_cache_mb: int = 512
    lambda_forecast: float | None = 100.0  # as `polyhead simulate --lambda`
    batch_window_s: float = 5.0  # live-B smoothing, as the gateway's default
    poll_s: float = 0.1  # step timings are drained and stamped with trace time this often


@dataclass(slots=True)
class ReplayResult:
    result: SimResult  # the simulator's fields, measured
    regime_s: dict[str, float] = field(default_factory=dict)  # busy step seconds per regime
    regime_tokens: dict[tuple[str, str], int] = field(default_factory=dict)  # (regime, head)
    head_tokens: dict[str, int] = field(default_factory=dict)  # output tokens per head
    head_bytes: dict[str, int] = field(default_factory=dict)  # output text bytes per head
    decode_steps: list[StepSample] = field(default_factory=list)  # for calibration

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
            max_num_batched_tokens=4096))
        self.prompts = PromptText()

    @property
    def kv_tokens(self) -> int:
        return self.engine.total_blocks() * self.engine.config.block_size

    async def warm_up(self) -> None:
        """One short request per head: first-step allocations are not charged to a run."""
        await self.engine.start()
        for h in self.profiles:
            await self._generate(h, self._ids(h, 64), 4)
        self.engine.drain_step_timings()

    async def close(self) -> None:
        await self.engine.shutdown()

    def _ids(self, head: str, n_bytes: int, index: int = 0) -> list[int]:
        spec = self.ckpt.manifest.head(head)
        ids = self.ckpt.tokenizers[head].encode(self.prompts.text(n_bytes, index))
        return ids if spec.bos_token_id is None else [spec.bos_token_id, *ids]

    async def _generate(self, head: str, ids: list[int], n: int) -> list[int]:
        req = GenerationRequest(f"replay-{time.perf_counter_ns()}", head, tuple(ids), n,
                                RowParams(temperature=0.0), frozenset())
        return [e.token_id async for e in self.engine.generate(req)]

    async def run(self, trace: Sequence[SimRequest], policy_doc: Mapping[str, Any], label: str,
                  regime_of: Callable[[float], str]) -> ReplayResult:
        profiles = list(self.profiles.values())
        timer = self.new_timer()
        state = LiveState.for_profiles(profiles, self.cfg.batch_window_s)
        state.set_lambda_forecast(self.cfg.lambda_forecast)
        router = Router(profiles, timer.device, state, policy_doc, timer=timer)
        out = ReplayResult(SimResult(label, requests=dict.fromkeys(self.profiles, 0)),
                           head_tokens=dict.fromkeys(self.profiles, 0),
                           head_bytes=dict.fromkeys(self.profiles, 0))
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

        async def serve(r: SimRequest, index: int) -> None:
            loads = self.engine.head_load()
            state.set_loads({h: (x.running, x.waiting) for h, x in loads.items()})
            d = router.decide(RequestFeatures(r.prompt_bytes, r.max_tokens))
            if last[0] is not None and d.head != last[0]:
                out.result.switches += 1
            last[0] = d.head
            bpt = self.profiles[d.head].bpt
            n = min(r.max_tokens, max(1, math.ceil(r.output_bytes / bpt)))
            ids = self._ids(d.head, r.prompt_bytes, index)
            tokens = await self._generate(d.head, ids, n)
            text = len(self.ckpt.tokenizers[d.head].decode(tokens).encode())
            out.result.latencies.append(clock() - r.arrival_s)
            out.result.output_bytes += text
            out.result.requests[d.head] += 1
            out.head_tokens[d.head] += len(tokens)
            out.head_bytes[d.head] += text
            state.add_served(d.head, r.prompt_bytes + text, len(ids) + len(tokens))

        last: list[str | None] = [None]
        poller = asyncio.create_task(poll())
        tasks = []
        for i, r in enumerate(trace):
            await asyncio.sleep(max(0.0, r.arrival_s - clock()))
            tasks.append(asyncio.create_task(serve(r, i)))
        try:
            await asyncio.gather(*tasks)
        finally:
            poller.cancel()
        drain()
        return out


def _account(out: ReplayResult, t: StepTiming, regime: str, timer: StepTimer) -> None:
    out.result.device_s += t.seconds
    out.result.steps += 1
    out.regime_s[regime] = out.regime_s.get(regime, 0.0) + t.seconds
    for head, n, _ in t.groups:  # every step, prefill included, samples one token per row
        key = (regime, head)
        out.regime_tokens[key] = out.regime_tokens.get(key, 0) + n
    if not t.prefill:
        out.result.max_batch = max(out.result.max_batch, sum(n for _, n, _ in t.groups))
        sample = StepSample(t.groups, t.seconds)
        out.decode_steps.append(sample)
        if isinstance(timer, CalibratedTimer):  # live calibration, as the gateway does
            timer.record(sample)

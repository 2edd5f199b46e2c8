"""vLLM as the gateway's engine: one or more replicas (in-process AsyncLLM or remote OpenAI
servers), each serving every head through the multi-head plugin, or one head each in the
fallback layout.

The gateway does what vLLM cannot do per head: it adds head h's offset to the prompt's IDs
and subtracts it from the sampled ones (checking each stays inside h's range), counts
in-flight requests per head (vLLM's gauges are per engine), polls each replica's health and
signals, and fails a request over to another healthy replica serving its head when its
replica cannot be reached before the first token. A replica lost mid-stream ends that stream
with an EngineLost error event; tokens already sent are never replayed.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Sequence

from heads.engine.types import (
    GenerationRequest,
    HeadLoad,
    PromptScore,
    TokenEvent,
    TokenLogprobs,
)
from heads.errors import EngineError, EngineLost, EngineUnavailable, EngineUnsupported
from server.backends.base import BackendBase
from server.backends.vllm.replicas import ReplicaSet
from server.backends.vllm.types import Chunk, Discovery, Replica, ReplicaFailed, VllmParams
from server.ops.engine_metrics import ReplicaStats

log = logging.getLogger(__name__)

# vLLM's finish reasons for a request the engine aborted or failed.
ENGINE_FAILED = frozenset({"abort", "error"})


class VllmBackend(BackendBase):
    def __init__(self, replicas: Sequence[Replica], head_sizes: dict[str, int],
                 poll_interval_s: float = 2.0, pass_seed: bool = False,
                 prompt_logprobs: bool = False, discovery: Discovery | None = None) -> None:
        self.set = ReplicaSet(replicas, poll_interval_s, discovery)
        self.head_sizes = head_sizes  # head -> V_h, to check every returned ID
        self.poll_interval_s = poll_interval_s
        self.pass_seed = pass_seed
        self.prompt_logprobs = prompt_logprobs
        self._waiting: Counter[str] = Counter()  # per head: sent, no token back yet
        self._running: Counter[str] = Counter()  # per head: streaming tokens

    @property
    def replicas(self) -> list[Replica]:
        return self.set.replicas

    async def start(self) -> None:
        await self.set.start()

    async def stop(self) -> None:
        await self.set.stop()

    def _params(self, req: GenerationRequest, offset: int) -> VllmParams:
        s, r = req.sampling, req.rules
        if r.bad_words_ids:
            # vLLM spells bad words with its own tokenizer; the engine runs without one (it
            # sees global ids only), so it cannot take them as ids.
            raise EngineUnsupported("bad_words is served by the local engine only")
        return VllmParams(
            prompt_ids=tuple(t + offset for t in req.prompt_ids), max_tokens=req.max_tokens,
            temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
            seed=s.seed if self.pass_seed else None,
            stop_token_ids=tuple(sorted(t + offset for t in req.stop_token_ids)),
            logprobs=req.want_logprobs,
            prompt_logprobs=req.score_prompt and self.prompt_logprobs,
            top_logprobs=req.top_logprobs, prompt_top=req.prompt_logprobs,
            repetition_penalty=r.repetition_penalty, presence_penalty=r.presence_penalty,
            frequency_penalty=r.frequency_penalty, min_p=r.min_p, min_tokens=r.min_tokens,
            logit_bias=tuple((t + offset, b) for t, b in r.logit_bias),
            allowed_token_ids=(None if r.allowed_token_ids is None
                               else tuple(sorted(t + offset for t in r.allowed_token_ids))),
        )

    async def generate(self, req: GenerationRequest) -> AsyncIterator[TokenEvent]:
        tried: set[str] = set()
        while True:
            replica = self.set.pick(req.head, tried)
            if replica is None:
                raise EngineUnavailable(f"no healthy vLLM engine serves head {req.head!r}")
            sent = 0
            self._waiting[req.head] += 1
            self.set.inflight[replica.name] += 1
            try:
                async for event in self._events(replica, req):
                    if sent == 0:
                        self._waiting[req.head] -= 1
                        self._running[req.head] += 1
                    sent += 1
                    yield event
                return
            except ReplicaFailed as e:
                replica.up = False  # until its next successful poll
                if sent:
                    self.set.lost_streams[replica.name] += 1
                    raise EngineLost(f"vLLM engine {replica.name} failed mid-stream after "
                                     f"{sent} tokens: {e}") from e
                log.warning("vLLM engine %s failed (%s); failing over", replica.name, e)
                self.set.failovers[replica.name] += 1
                tried.add(replica.name)
            finally:
                (self._running if sent else self._waiting)[req.head] -= 1
                self.set.inflight[replica.name] -= 1

    async def _events(self, replica: Replica, req: GenerationRequest) -> AsyncIterator[TokenEvent]:
        offset, size = replica.offsets[req.head], self.head_sizes[req.head]
        rid = f"{req.request_id}-{uuid.uuid4().hex[:8]}"
        stream = replica.stream(self._params(req, offset), rid)
        predicted = len(req.prompt_ids) - 1
        finished = False
        try:
            while not finished:
                chunk = await self._next(stream, replica)
                if chunk is None:
                    raise ReplicaFailed(f"{replica.name}: stream ended without a finish reason")
                if chunk.finish_reason in ENGINE_FAILED:
                    # The engine gave up on the request: an error, never a normal end.
                    raise EngineLost(f"vLLM engine {replica.name} ended the request with "
                                     f"finish reason '{chunk.finish_reason}'")
                score = None
                if chunk.prompt_nll is not None:
                    score = PromptScore(chunk.prompt_nll, predicted, predicted)
                prompt = None
                if chunk.prompt_lps is not None:
                    prompt = tuple(TokenLogprobs(lp, _local(top, offset, size), rank)
                                   for lp, rank, top in chunk.prompt_lps)
                for i, gid in enumerate(chunk.token_ids):
                    local = gid - offset
                    if not 0 <= local < size:
                        raise EngineError(f"vLLM engine {replica.name} sampled id {gid}, "
                                          f"outside head {req.head!r}'s range")
                    last = i == len(chunk.token_ids) - 1
                    finished = last and chunk.finish_reason is not None
                    top = None
                    if chunk.tops is not None:
                        alts = _local(chunk.tops[i], offset, size)
                        top = TokenLogprobs(next((v for t, v in alts if t == local),
                                                 chunk.logprobs[i] if chunk.logprobs else
                                                 float("nan")), alts)
                    yield TokenEvent(
                        local, chunk.logprobs[i] if chunk.logprobs else None,
                        _finish(chunk.finish_reason) if last else None,
                        score if i == 0 else None, None, top, prompt if i == 0 else None,
                    )
                if chunk.finish_reason is not None and not chunk.token_ids:
                    raise ReplicaFailed(f"{replica.name}: finished ({chunk.finish_reason}) "
                                        "without a token")
        finally:
            await stream.aclose()  # aborts the request in the engine when we stop early

    async def _next(self, stream: AsyncGenerator[Chunk, None], replica: Replica) -> Chunk | None:
        """The next chunk, or ReplicaFailed as soon as the health poll marks the replica down
        (a host cut off the network sends no reset: without this a stream waits out its
        read timeout)."""
        task = asyncio.ensure_future(anext(stream, None))
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=self.poll_interval_s)
                if done:
                    return task.result()
                if not replica.up:
                    raise ReplicaFailed(f"{replica.name}: marked down by the health check")
        finally:
            if not task.done():  # down, or our consumer was cancelled while we waited
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    def head_load(self) -> dict[str, HeadLoad]:
        return {h: HeadLoad(self._running[h], self._waiting[h]) for h in self.head_sizes}

    def kv_blocks(self) -> tuple[int, int]:
        live = self.set.live_signals()
        return sum(s.blocks_used for s in live), sum(s.num_blocks for s in live)

    def kv_block_size(self) -> int | None:
        sizes = {s.block_size for s in self.set.live_signals() if s.block_size}
        return min(sizes) if sizes else None

    def replica_stats(self) -> list[ReplicaStats]:
        return self.set.stats()


def _finish(reason: str | None) -> str | None:
    # "stop" and "length" are the ends a client sees; ENGINE_FAILED reasons never get here.
    # Anything else vLLM may add (e.g. a matched stop string) ended the request normally.
    return reason if reason in (None, "stop", "length") else "stop"


def _local(top: tuple[tuple[int, float], ...], offset: int, size: int
           ) -> tuple[tuple[int, float], ...]:
    """Alternatives in the head's own ids; the plugin's -inf columns never rank in them."""
    out = tuple((t - offset, v) for t, v in top)
    if any(not 0 <= t < size for t, _ in out):
        raise EngineError("vLLM ranked a token outside the request's head")
    return out

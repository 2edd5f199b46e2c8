"""vLLM's AsyncLLM inside the gateway process (its engine core still runs in a child process).

The model directory is a `polyhead export vllm` directory: one engine serves every head.
Live signals come from the Prometheus registry vLLM's stat logger fills in this process,
the same series a remote engine exposes on /metrics.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from server.backends.vllm.logprobs import prompt_records, top_n
from server.backends.vllm.signals import EngineSignals, parse_signals
from server.backends.vllm.types import Chunk, ReplicaFailed, VllmParams

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class InProcessConfig:
    model_dir: Path
    dtype: str = "float32"
    max_model_len: int | None = None
    kv_cache_gb: float = 1.0  # VLLM_CPU_KVCACHE_SPACE on CPU
    gpu_memory_utilization: float = 0.9
    enforce_eager: bool = False
    max_num_seqs: int = 64


class InProcessReplica:
    name = "in-process"

    def __init__(self, config: InProcessConfig, heads: frozenset[str],
                 offsets: dict[str, int]) -> None:
        self.config = config
        self.heads = heads
        self.offsets = offsets
        self.up = False
        self.signals = EngineSignals()
        self._engine: Any = None

    async def start(self) -> None:
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        c = self.config
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, math.ceil(c.kv_cache_gb))))
        extra: dict[str, Any] = {"dtype": c.dtype}
        if c.max_model_len is not None:
            extra["max_model_len"] = c.max_model_len
        args = AsyncEngineArgs(
            model=str(c.model_dir), skip_tokenizer_init=True, enforce_eager=c.enforce_eager,
            **extra,
            gpu_memory_utilization=c.gpu_memory_utilization, max_num_seqs=c.max_num_seqs,
            disable_log_stats=False,  # the Prometheus stat logger feeds the live signals
        )
        self._engine = AsyncLLM.from_engine_args(args)
        await self.poll()

    async def stop(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None
        self.up = False

    async def poll(self) -> None:
        try:
            from prometheus_client import REGISTRY, generate_latest

            if self._engine is None or self._engine.errored:
                raise ReplicaFailed("engine stopped")
            await self._engine.check_health()
            self.signals = parse_signals(generate_latest(REGISTRY).decode())
            self.up = True
        except Exception as e:  # noqa: BLE001 - any failure means: not serving
            if self.up:
                log.warning("in-process vLLM engine is down: %r", e)
            self.up = False

    async def stream(self, params: VllmParams, request_id: str) -> AsyncGenerator[Chunk, None]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        if self._engine is None:
            raise ReplicaFailed("in-process engine not started")
        sp = SamplingParams(
            max_tokens=params.max_tokens, temperature=params.temperature, top_p=params.top_p,
            top_k=params.top_k, seed=params.seed, stop_token_ids=list(params.stop_token_ids),
            logprobs=params.top_logprobs if params.logprobs or params.top_logprobs else None,
            prompt_logprobs=(params.prompt_top if params.prompt_top is not None
                             else 0 if params.prompt_logprobs else None),
            output_kind=RequestOutputKind.DELTA, detokenize=False, skip_special_tokens=False,
            **params.shaping(),
        )
        prompt = TokensPrompt(prompt_token_ids=list(params.prompt_ids))
        from vllm.v1.engine.exceptions import EngineDeadError

        try:
            async for chunk in self._chunks(prompt, sp, request_id, params):
                yield chunk
        except EngineDeadError as e:
            raise ReplicaFailed(f"in-process engine died: {e}") from e

    async def _chunks(self, prompt: Any, sp: Any, request_id: str,
                      params: VllmParams) -> AsyncIterator[Chunk]:
        first = True
        async for out in self._engine.generate(prompt, sp, request_id):
            o = out.outputs[0]
            lps = tops = None
            if o.logprobs:
                ranked = [_ranked(d) for d in o.logprobs]
                lps = tuple(r[t][0] for r, t in zip(ranked, o.token_ids, strict=True))
                if params.top_logprobs:
                    tops = tuple(top_n(r, params.top_logprobs) for r in ranked)
            nll: float | None = None
            prompt = None
            if first and out.prompt_logprobs:
                ids = params.prompt_ids
                entries = [None if d is None else _ranked(d) for d in out.prompt_logprobs]
                records = prompt_records(entries, ids, params.prompt_top or 0)
                if params.prompt_logprobs:
                    nll = -sum(lp for lp, _, _ in records)
                if params.prompt_top is not None:
                    prompt = records
            first = False
            yield Chunk(tuple(o.token_ids), lps if params.logprobs else None, o.finish_reason,
                        nll, tops, prompt)


def _ranked(d: Any) -> dict[int, tuple[float, int]]:
    # vLLM's {id: Logprob(logprob, rank, decoded_token)}
    return {tid: (lp.logprob, lp.rank) for tid, lp in d.items()}

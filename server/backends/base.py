"""The seam between the gateway and an engine: token IDs in, token events out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Protocol

from heads.engine.types import (
    DraftTally,
    GenerationRequest,
    HeadLoad,
    StepTiming,
    TokenEvent,
)

if TYPE_CHECKING:
    from heads.engine.grammar import GrammarCompiler
    from server.ops.engine_metrics import ReplicaStats


class Backend(Protocol):
    """An engine serving every head of one checkpoint.

    `generate` is an async generator: closing it early (client gone, stop string hit)
    aborts the request inside the engine and frees its KV blocks.

    The methods after `kv_blocks` are optional capabilities: a backend that lacks one
    answers None (or, for `step_timings`, an empty list), and the gateway then exports
    nothing for it. BackendBase supplies those defaults.
    """

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]: ...

    def head_load(self) -> dict[str, HeadLoad]: ...

    def kv_blocks(self) -> tuple[int, int]:
        """(used, total) KV-cache blocks."""
        ...

    def kv_block_size(self) -> int | None:
        """Tokens per KV block as the engine reports it; None: unknown, the gateway uses its
        configured block size."""
        ...

    def step_timings(self) -> list[StepTiming]:
        """Measured engine steps since the last call (each call drains them), for the
        router's cost calibration; empty when the engine does not measure its steps."""
        ...

    def kernel_counts(self) -> dict[tuple[str, str], int] | None:
        """{(head, kernel): head groups unembedded with that kernel} since start; None when
        the engine does not count them."""
        ...

    def prefix_cache_counts(self) -> dict[str, tuple[int, int]] | None:
        """{head: (prompt tokens queried, prompt tokens served from the prefix cache)} since
        start; None when the engine has no prefix-cache counters."""
        ...

    def drafting_stats(self) -> tuple[tuple[float, float], dict[str, DraftTally], int] | None:
        """((prompt, probe) seconds of the measured quality guard, drafter -> exact drafting
        totals, the last drafting step's k) since start; None when the engine has neither."""
        ...

    def replica_stats(self) -> list[ReplicaStats] | None:
        """Health and traffic of each engine replica behind the backend; None when it has no
        separate replicas."""
        ...

    def grammar_compiler(self) -> GrammarCompiler | None:
        """The compiler of structured-output grammars the engine constrains with; None when
        the engine serves no structured output (the gateway then answers 400)."""
        ...

    def max_model_len(self) -> int | None:
        """The most tokens (prompt + output) one request can reach on the started engine;
        None: the configured context is the limit (the engine checks it itself)."""
        ...


class BackendBase:
    """Defaults for Backend's optional capabilities: every one answers "not supported"."""

    def kv_block_size(self) -> int | None:
        return None

    def step_timings(self) -> list[StepTiming]:
        return []

    def kernel_counts(self) -> dict[tuple[str, str], int] | None:
        return None

    def prefix_cache_counts(self) -> dict[str, tuple[int, int]] | None:
        return None

    def drafting_stats(self) -> tuple[tuple[float, float], dict[str, DraftTally], int] | None:
        return None

    def replica_stats(self) -> list[ReplicaStats] | None:
        return None

    def grammar_compiler(self) -> GrammarCompiler | None:
        return None

    def max_model_len(self) -> int | None:
        return None

"""The embedded default: the in-process paged engine from heads/."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Collection

import torch

from heads.engine.config import EngineConfig
from heads.engine.grammar import GrammarCompiler
from heads.engine.grouped_reading import GroupedReading
from heads.engine.llm_engine import LocalEngine
from heads.engine.types import (
    DraftTally,
    GenerationRequest,
    HeadLoad,
    QualityLadder,
    StepTiming,
    TokenEvent,
)
from heads.model.multi_head import MultiHeadModel
from kernels.row_params import RowParams
from server.backends.base import BackendBase

MEASURED_TOKENS = 6  # per head at start: five one-row decode steps for the calibration
WARM_PROMPTS = (24, 96)  # prompt lengths, tokens, prefilled per head at start


class LocalBackend(BackendBase):
    def __init__(self, model: MultiHeadModel, config: EngineConfig, torch_threads: int = 0,
                 grammars: GrammarCompiler | None = None,
                 readings: Collection[GroupedReading] = ()):
        if torch_threads:
            # Set here, not at import: the thread count is an operator choice per process.
            torch.set_num_threads(torch_threads)
        self.model = model
        self.grammars = grammars
        self.engine = LocalEngine(model, config, grammars, readings)
        self._grammar_warm: threading.Thread | None = None

    async def start(self) -> None:
        await self.engine.start()
        await self._warm_up()
        if self.grammars is not None:
            # The vocabulary table takes seconds; build it beside serving, not before it.
            # Daemon so a hung build cannot pin the process, but joined at stop: a thread
            # still importing or inside xgrammar's C++ while the interpreter finalises can
            # abort the process (SIGABRT) instead of a clean exit.
            self._grammar_warm = threading.Thread(target=self.grammars.warm,
                                                  name="grammar-warm", daemon=True)
            self._grammar_warm.start()

    def grammar_compiler(self) -> GrammarCompiler | None:
        return self.grammars

    def max_model_len(self) -> int:
        return self.engine.longest_sequence()

    async def _warm_up(self) -> None:
        """Two greedy tokens per head and reading before the gateway is ready, then
        MEASURED_TOKENS more per head whose decode steps the router's calibration keeps, and
        a prefill of each WARM_PROMPTS length per head (a reading's measured, as the router
        ladders it). The first steps pay for allocations and lazy initialisation; measured,
        they would teach the calibration that a step costs many times what it does, so the
        timings of a first pass are dropped. The steps after them give every head a measured
        one-row step and prefill before its first request: a head the router never chose
        would otherwise be priced only by the fit over the others, and a reading's first
        steps at 3-6x its time."""
        manifest = self.model.manifest
        native = manifest.native
        # A reading reads native ids: it starts from the native head's first token.
        heads = [(spec.name, spec) for spec in manifest.heads] + [
            (name, native) for name in self.engine.readings]
        for measured in (False, True):
            for i, (name, spec) in enumerate(heads):
                first = (spec.bos_token_id if spec.bos_token_id is not None
                         else spec.eos_token_ids[0])
                n = MEASURED_TOKENS if measured else 2
                await self._drain(GenerationRequest(f"warm-up-{name}", name, (first,), n,
                                                    RowParams(temperature=0.0), frozenset()))
                ladder = (QualityLadder((name, native.name), bound=0.05)
                          if name in self.engine.readings else None)
                for j, length in enumerate(WARM_PROMPTS):
                    # Ids no other warm-up prompt shares, so no prefix cache hit shortens it
                    # (where the vocabulary is large enough; the tiny test model's is not).
                    start = 1000 + (2 * i + j + len(heads) * measured) * max(WARM_PROMPTS)
                    length = min(length, self.engine.longest_sequence() - 1)
                    prompt = (first, *(k % spec.vocab_size
                                       for k in range(start, start + length - 1)))
                    await self._drain(GenerationRequest(
                        f"warm-up-{name}-{length}", name, prompt, 1,
                        RowParams(temperature=0.0), frozenset(), ladder=ladder))
            if not measured:
                self.engine.drain_step_timings()

    async def _drain(self, request: GenerationRequest) -> None:
        async for _ in self.engine.generate(request):
            pass

    async def stop(self) -> None:
        await self.engine.shutdown()
        if self._grammar_warm is not None:
            await asyncio.to_thread(self._grammar_warm.join)
            self._grammar_warm = None

    def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        return self.engine.generate(request)

    def head_load(self) -> dict[str, HeadLoad]:
        return self.engine.head_load()

    def prefix_cache_counts(self) -> dict[str, tuple[int, int]]:
        """-> {head: (prompt tokens queried, prompt tokens served from the prefix cache)}."""
        return self.engine.prefix_cache_counts()

    def kernel_counts(self) -> dict[tuple[str, str], int]:
        return self.engine.kernel_counts()

    def drafting_stats(self) -> tuple[tuple[float, float], dict[str, DraftTally], int]:
        return (self.engine.quality_seconds(), self.engine.drafting_tallies(),
                self.engine.draft_k())

    def kv_blocks(self) -> tuple[int, int]:
        total = self.engine.total_blocks()
        return total - self.engine.free_blocks(), total

    def step_timings(self) -> list[StepTiming]:
        """Measured engine steps since the last call, for the router's calibration."""
        return self.engine.drain_step_timings()

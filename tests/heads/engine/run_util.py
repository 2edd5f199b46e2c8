"""Run requests through a real LocalEngine to completion, for the engine's tests."""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Any

from heads.engine.config import EngineConfig
from heads.engine.grouped_reading import GroupedReading
from heads.engine.llm_engine import LocalEngine
from heads.engine.types import GenerationRequest, TokenEvent
from heads.model.multi_head import MultiHeadModel


def run_requests(model: MultiHeadModel, *reqs: GenerationRequest, num_kv_blocks: int = 64,
                 readings: Collection[GroupedReading] = (), **config: Any
                 ) -> list[list[TokenEvent]]:
    """Every request's events, all submitted at once (so they share steps); `config`: more
    EngineConfig fields."""
    async def go() -> list[list[TokenEvent]]:
        engine = LocalEngine(model, EngineConfig(num_kv_blocks=num_kv_blocks, **config),
                             readings=readings)
        await engine.start()
        try:
            async def one(r: GenerationRequest) -> list[TokenEvent]:
                return [e async for e in engine.generate(r)]
            return list(await asyncio.gather(*(one(r) for r in reqs)))
        finally:
            await engine.shutdown()
    return asyncio.run(go())

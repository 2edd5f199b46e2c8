"""The seam between the gateway and an engine: token IDs in, token events out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from heads.engine.types import GenerationRequest, HeadLoad, TokenEvent


class Backend(Protocol):
    """An engine serving every head of one checkpoint.

    `generate` is an async generator: closing it early (client gone, stop string hit)
    aborts the request inside the engine and frees its KV blocks.
    """

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]: ...

    def head_load(self) -> dict[str, HeadLoad]: ...

    def kv_blocks(self) -> tuple[int, int]:
        """(used, total) KV-cache blocks."""
        ...

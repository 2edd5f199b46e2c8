"""A backend without a model: it echoes the prompt's token IDs back, `max_tokens` of them.

Used to measure the gateway alone (`polyhead bench gateway`, overload tests). With
`token_delay_s` = 0 every token is ready at once; a small delay holds streams open.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from heads.engine.types import GenerationRequest, HeadLoad, TokenEvent
from server.backends.base import BackendBase


class EchoBackend(BackendBase):
    def __init__(self, heads: list[str], token_delay_s: float = 0.0) -> None:
        self.token_delay_s = token_delay_s
        self._running = dict.fromkeys(heads, 0)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        ids = [i for i in request.prompt_ids if i not in request.stop_token_ids] or [0]
        self._running[request.head] += 1
        try:
            for n in range(request.max_tokens):
                if self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
                last = n == request.max_tokens - 1
                yield TokenEvent(ids[n % len(ids)], 0.0 if request.want_logprobs else None,
                                 "length" if last else None)
        finally:
            self._running[request.head] -= 1

    def head_load(self) -> dict[str, HeadLoad]:
        return {h: HeadLoad(r, 0) for h, r in self._running.items()}

    def kv_blocks(self) -> tuple[int, int]:
        return 0, 0

"""Per-client gate of the OpenAI routes: API keys, then per-key rate limits and usage."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from server.errors import TooManyRequests, Unauthorized
from server.ops.auth import KeyRing, bearer
from server.ops.metrics import Metrics
from server.ops.ratelimit import RateLimiter
from server.ops.redis_state import BufferedCounters

log = logging.getLogger(__name__)

ANONYMOUS = "anonymous"


@dataclass(frozen=True, slots=True)
class Charge:
    """What a request was charged up front: `tokens` (prompt + every choice's max_tokens) of
    `client`'s budget at unix time `at`; `prompt_tokens` of them are the prompt's."""

    client: str
    tokens: int
    prompt_tokens: int
    at: float


class ClientGuard:
    def __init__(self, keys: KeyRing, limiter: RateLimiter | None = None,
                 usage: BufferedCounters | None = None, metrics: Metrics | None = None) -> None:
        self.keys = keys
        self.limiter = limiter
        self.usage = usage
        self.metrics = metrics

    def authenticate(self, authorization: str) -> str:
        """The client key's name; anonymous when no keys are configured."""
        if not self.keys:
            return ANONYMOUS
        token = bearer(authorization)
        name = self.keys.match(token) if token else None
        if name is None:
            raise Unauthorized("missing or invalid API key", headers={"WWW-Authenticate": "Bearer"})
        return name

    async def charge(self, client: str, prompt_tokens: int, max_output_tokens: int) -> Charge:
        """Charge a request to the client's budget: 429 with Retry-After when over it. It
        assumes every choice runs to max_tokens; `settle` corrects that."""
        charge = Charge(client, prompt_tokens + max_output_tokens, prompt_tokens, time.time())
        if self.limiter is not None:
            retry_after = await self.limiter.acquire(client, charge.tokens, charge.at)
            if retry_after is not None:
                raise TooManyRequests(
                    f"rate limit of key '{client}' reached; retry in {retry_after:.0f} s",
                    headers={"retry-after": f"{retry_after:.0f}"}, reason="rate_limit")
        if self.metrics is not None:
            self.metrics.client_requests.labels(client).inc()
        if self.usage is not None:
            await self.usage.incr(f"usage:{client}",
                                  {"requests": 1, "prompt_tokens": prompt_tokens})
        return charge

    async def settle(self, charge: Charge, completion_tokens: int) -> None:
        """When the request ends: give the tokens it did not use back to the rate limit,
        and count the ones generated. Never raises (the answer is already on its way)."""
        unused = charge.tokens - charge.prompt_tokens - completion_tokens
        try:
            if self.limiter is not None and unused > 0:
                await self.limiter.refund(charge.client, unused, charge.at)
            if self.usage is not None and completion_tokens:
                await self.usage.incr(f"usage:{charge.client}",
                                      {"completion_tokens": completion_tokens})
        except Exception as e:  # noqa: BLE001 - a lost refund must not fail the request
            log.warning("token accounting of %s not settled: %s", charge.client, e)

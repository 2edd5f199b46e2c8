"""Client-side gate of the OpenAI routes: API keys, request-shape limits, per-key rate limits."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from server.auth import KeyRing, bearer
from server.errors import BadRequest, TooManyRequests, Unauthorized
from server.generation import Outcome
from server.metrics import Metrics
from server.ratelimit import RateLimiter
from server.redis_state import BufferedCounters
from server.request_plan import RequestPlan
from server.schemas import ChatCompletionRequest, CompletionRequest

log = logging.getLogger(__name__)

ANONYMOUS = "anonymous"


@dataclass(frozen=True, slots=True)
class Charge:
    """What admit charged a client: `tokens` (prompt + max_tokens) at unix time `at`."""

    client: str
    tokens: int
    at: float


class ClientGuard:
    def __init__(self, keys: KeyRing, max_n: int, max_prompt_bytes: int,
                 limiter: RateLimiter | None = None, usage: BufferedCounters | None = None,
                 metrics: Metrics | None = None) -> None:
        self.keys = keys
        self.max_n = max_n
        self.max_prompt_bytes = max_prompt_bytes
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

    def check_shape(self, body: CompletionRequest | ChatCompletionRequest) -> None:
        """Limits checked before the prompt is tokenized."""
        if body.n > self.max_n:
            raise BadRequest(f"n={body.n} exceeds the limit {self.max_n}", param="n")
        if isinstance(body, CompletionRequest):
            size = sum(len(p.encode()) for p in body.prompts())
            param = "prompt"
        else:
            size = sum(len(m.text().encode()) for m in body.messages)
            param = "messages"
        if size > self.max_prompt_bytes:
            raise BadRequest(f"prompt is {size} bytes; the limit is {self.max_prompt_bytes}",
                             param=param)

    async def admit(self, client: str, plan: RequestPlan) -> Charge:
        """Charge the request to the client's budget: 429 with Retry-After when over it.
        The charge assumes every choice runs to max_tokens; `settle` corrects it."""
        tokens = plan.prompt_tokens + sum(j.request.max_tokens for j in plan.jobs)
        charge = Charge(client, tokens, time.time())
        if self.limiter is not None:
            retry_after = await self.limiter.acquire(client, tokens, charge.at)
            if retry_after is not None:
                raise TooManyRequests(
                    f"rate limit of key '{client}' reached; retry in {retry_after:.0f} s",
                    headers={"retry-after": f"{retry_after:.0f}"}, reason="rate_limit")
        if self.metrics is not None:
            self.metrics.client_requests.labels(client).inc()
        if self.usage is not None:
            await self.usage.incr(f"usage:{client}",
                                  {"requests": 1, "prompt_tokens": plan.prompt_tokens})
        return charge

    async def settle(self, charge: Charge, plan: RequestPlan, outcomes: list[Outcome]) -> None:
        """When the request ends: give the tokens it did not use back to the rate limit,
        and count the ones generated. Never raises (the answer is already on its way)."""
        completion = sum(o.completion_tokens for o in outcomes)
        unused = charge.tokens - plan.prompt_tokens - completion
        try:
            if self.limiter is not None and unused > 0:
                await self.limiter.refund(charge.client, unused, charge.at)
            if self.usage is not None and completion:
                await self.usage.incr(f"usage:{charge.client}", {"completion_tokens": completion})
        except Exception as e:  # noqa: BLE001 - a lost refund must not fail the request
            log.warning("token accounting of %s not settled: %s", charge.client, e)

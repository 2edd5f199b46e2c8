"""Admission from KV savings: how many requests each head can hold in the KV block budget.

A request's expected footprint on head h, in KV blocks of `block_size` tokens:

    tokens_h = prompt_tokens_h + expected_output_tokens_h
    expected_output_tokens_h = min(max_tokens, q · max_tokens / bpt_h)

where q is a quantile (configurable, default p90) of the output bytes per token of
max_tokens observed on finished requests, i.e. (actual ÷ max_tokens) × bpt of the head that
served it. Learning it in bytes makes it head-independent: the same text needs fewer tokens
on a better-compressing head, so that head reserves fewer blocks. Until `min_samples` are
seen, q = prior_ratio × bpt_h (prior 1.0: every request may use all of max_tokens).

The prompt is counted in head h's own tokens (the gateway tokenizes before admitting), so
the prompt's KV shrinks with compression too.

Per-head max batch = requests of that head already admitted + how many more of a typical
request (smoothed prompt bytes and max_tokens of recent requests) fit in the blocks left,
capped by the engine's max_num_seqs. It is computed from the live budget on demand, so it
follows policy, head and budget changes without a separate recompute step.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from router.profiles import HeadProfile

log = logging.getLogger(__name__)

DRAIN_WINDOW_S = 60.0
MAX_RETRY_AFTER_S = 300


@dataclass(frozen=True, slots=True)
class KVBudget:
    total_blocks: int
    block_size: int  # tokens per block
    max_num_seqs: int = 1 << 30  # the engine's running-sequence cap

    def __post_init__(self) -> None:
        if self.total_blocks < 1 or self.block_size < 1 or self.max_num_seqs < 1:
            raise ValueError("KV budget: blocks, block size and max_num_seqs must be >= 1")


@dataclass(frozen=True, slots=True)
class Ticket:
    id: int
    head: str
    blocks: int
    admitted_at: float


class OutputRatio:
    """Online quantile of output bytes per max_tokens token, over the last `window` requests."""

    def __init__(self, quantile: float = 0.9, prior_ratio: float = 1.0, window: int = 512,
                 min_samples: int = 8) -> None:
        if not 0 < quantile <= 1 or not 0 < prior_ratio <= 1 or window < 1:
            raise ValueError("quantile and prior_ratio must be in (0, 1], window >= 1")
        self.quantile, self.prior_ratio, self.min_samples = quantile, prior_ratio, min_samples
        self._lock = threading.Lock()
        self._seen: deque[float] = deque(maxlen=window)
        self._q: float | None = None

    def observe(self, output_tokens: int, max_tokens: int, bpt: float) -> None:
        if max_tokens <= 0:
            return
        with self._lock:
            self._seen.append(min(output_tokens, max_tokens) / max_tokens * bpt)
            self._q = None

    def bytes_per_max_token(self) -> float | None:
        with self._lock:
            if len(self._seen) < self.min_samples:
                return None
            if self._q is None:
                ranked = sorted(self._seen)
                self._q = ranked[min(len(ranked) - 1, math.ceil(self.quantile * len(ranked)) - 1)]
            return self._q

    def expected_tokens(self, max_tokens: int, bpt: float) -> float:
        q = self.bytes_per_max_token()
        if q is None:
            return self.prior_ratio * max_tokens
        return min(float(max_tokens), q * max_tokens / bpt)


class Admission:
    """Reservations of KV blocks by admitted requests; thread-safe, clock injectable."""

    def __init__(self, profiles: Iterable[HeadProfile], budget: KVBudget,
                 ratio: OutputRatio | None = None, clock: Callable[[], float] = time.monotonic,
                 typical_window: int = 64) -> None:
        self.profiles = {p.name: p for p in profiles}
        self.budget = budget
        self.ratio = ratio or OutputRatio()
        self._clock = clock
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._tickets: dict[int, Ticket] = {}
        self._reserved = 0
        self._by_head = dict.fromkeys(self.profiles, 0)
        self._released: deque[tuple[float, int]] = deque()  # (time, blocks) for the drain rate
        self._typical: deque[tuple[int, int]] = deque(maxlen=typical_window)

    # --- sizing ---------------------------------------------------------------------------

    def expected_tokens(self, head: str, prompt_tokens: int, max_tokens: int,
                        bpt: float | None = None) -> float:
        """`bpt`: this request's predicted output bytes/token on `head` (router.compression);
        the head's manifest figure when not given."""
        return prompt_tokens + self.ratio.expected_tokens(
            max_tokens, self.profiles[head].bpt if bpt is None else bpt)

    def footprint_blocks(self, head: str, prompt_tokens: int, max_tokens: int, n: int = 1,
                         bpt: float | None = None) -> int:
        per_seq = math.ceil(self.expected_tokens(head, prompt_tokens, max_tokens, bpt)
                            / self.budget.block_size)
        return n * max(1, per_seq)

    def observe_request(self, prompt_bytes: int, max_tokens: int) -> None:
        """Feed the typical request that max_batch sizes against."""
        with self._lock:
            self._typical.append((prompt_bytes, max_tokens))

    def typical_blocks(self, head: str) -> int:
        with self._lock:
            seen = list(self._typical)
        if not seen:
            return 1
        bpt = self.profiles[head].bpt
        prompt = sum(b for b, _ in seen) / len(seen) / bpt
        max_tokens = round(sum(m for _, m in seen) / len(seen))
        return self.footprint_blocks(head, math.ceil(prompt), max_tokens)

    def max_batch(self, head: str, used_blocks: int = 0) -> int:
        """Requests of `head` that can run at once now: admitted ones plus what still fits."""
        typical = self.typical_blocks(head)
        with self._lock:
            free = self.budget.total_blocks - max(self._reserved, used_blocks)
            return min(self.budget.max_num_seqs, self._by_head[head] + max(0, free) // typical)

    # --- reservations -----------------------------------------------------------------------

    def try_admit(self, head: str, blocks: int, used_blocks: int = 0) -> Ticket | None:
        """Reserve `blocks` for a request on `head`, or None when they do not fit now.

        `used_blocks` is the engine's live usage: when requests outgrow their expectation,
        the budget follows what the engine really holds.
        """
        with self._lock:
            held = max(self._reserved, used_blocks)
            # An empty gateway admits any request the engine itself accepts, even one above
            # the budget alone: otherwise it could never run (the engine has the final say).
            if self._tickets and held + blocks > self.budget.total_blocks:
                return None
            t = Ticket(next(self._ids), head, blocks, self._clock())
            self._tickets[t.id] = t
            self._reserved += blocks
            self._by_head[head] += 1
            return t

    def release(self, ticket: Ticket, output_tokens: int | None = None,
                max_tokens: int | None = None) -> None:
        with self._lock:
            if self._tickets.pop(ticket.id, None) is None:
                return  # released twice
            self._reserved -= ticket.blocks
            self._by_head[ticket.head] -= 1
            self._released.append((self._clock(), ticket.blocks))
        if output_tokens is not None and max_tokens:
            self.ratio.observe(output_tokens, max_tokens, self.profiles[ticket.head].bpt)

    @property
    def reserved_blocks(self) -> int:
        return self._reserved

    def admitted(self, head: str) -> int:
        return self._by_head[head]

    def drain_rate(self) -> float:
        """KV blocks released per second over the last minute."""
        now = self._clock()
        with self._lock:
            while self._released and now - self._released[0][0] > DRAIN_WINDOW_S:
                self._released.popleft()
            if not self._released:
                return 0.0
            span = max(1.0, now - self._released[0][0])
            return sum(b for _, b in self._released) / span

    def retry_after_s(self, blocks: int, fallback_s: float = 1.0) -> int:
        """Seconds until `blocks` are likely free, from the drain rate; >= 1 (HTTP wants int)."""
        with self._lock:
            deficit = self._reserved + blocks - self.budget.total_blocks
        rate = self.drain_rate()
        wait = deficit / rate if rate > 0 and deficit > 0 else fallback_s
        return int(min(MAX_RETRY_AFTER_S, max(1, math.ceil(wait))))

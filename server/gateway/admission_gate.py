"""The async side of KV admission: a bounded queue with a bounded wait in front of
router.admission, and the 429 (with Retry-After) when neither holds.

A request that does not fit waits for a release while fewer than `max_queue` others wait,
for at most `max_wait_s`; then AdmissionRejected, which server/errors.py maps to 429.
Nothing is dropped silently: every request is admitted, or answered with 429.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from router.admission import Admission, Ticket
from router.errors import AdmissionRejected

log = logging.getLogger(__name__)


class AdmissionGate:
    def __init__(self, admission: Admission, max_queue: int, max_wait_s: float) -> None:
        self.admission = admission
        self.max_queue = max_queue
        self.max_wait_s = max_wait_s
        self.waiting = 0
        self._changed = asyncio.Event()

    def try_now(self, head: str, blocks: int, used_blocks: int) -> Ticket | None:
        # Arrivals do not overtake requests already queued.
        if self.waiting:
            return None
        return self.admission.try_admit(head, blocks, used_blocks)

    async def wait(self, head: str, blocks: int, used: Callable[[], int]) -> Ticket:
        """Queue for `blocks` on `head`; raises AdmissionRejected when full or out of time."""
        if self.waiting >= self.max_queue:
            raise self._reject(head, blocks, f"queue of {self.max_queue} is full")
        deadline = time.monotonic() + self.max_wait_s
        self.waiting += 1
        try:
            while True:
                ticket = self.admission.try_admit(head, blocks, used())
                if ticket is not None:
                    return ticket
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._reject(head, blocks, f"waited {self.max_wait_s:g} s")
                event = self._changed
                try:
                    # Wake on a release, or poll: engine usage also changes without one.
                    await asyncio.wait_for(event.wait(), min(left, 0.05))
                except TimeoutError:
                    pass
        finally:
            self.waiting -= 1

    def release(self, ticket: Ticket, output_tokens: int | None = None,
                max_tokens: int | None = None) -> None:
        self.admission.release(ticket, output_tokens, max_tokens)
        self._changed.set()
        self._changed = asyncio.Event()

    def _reject(self, head: str, blocks: int, why: str) -> AdmissionRejected:
        retry = self.admission.retry_after_s(blocks, fallback_s=max(1.0, self.max_wait_s))
        log.info("429 on head %s: %d KV blocks do not fit (%s); retry after %d s",
                 head, blocks, why, retry)
        return AdmissionRejected(head, retry, why)

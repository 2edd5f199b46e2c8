"""Per-request context: the correlation id (x-request-id) for responses and log lines.

An incoming `x-request-id` is honoured when it is short and printable; otherwise the
gateway makes one. Completion handlers may bind their completion id instead, so that the
header, the response body's id and the logs agree.
"""

from __future__ import annotations

import logging
import random
import re
from contextvars import ContextVar
from dataclasses import dataclass

_VALID_ID = re.compile(r"^[A-Za-z0-9._:/+=-]{1,128}$")


def new_id(prefix: str) -> str:
    """`prefix` + 24 random hex digits. Ids must be unique, not unguessable: the stdlib PRNG
    (seeded from os.urandom in each process) costs ~0.3 µs where secrets' syscall costs ~3."""
    return f"{prefix}{random.getrandbits(96):024x}"


@dataclass(slots=True)
class RequestContext:
    _request_id: str | None  # None until read: most requests bind their completion id first
    from_client: bool
    engine_s: float = 0.0  # waits on the engine, for the gateway-overhead histogram

    @property
    def request_id(self) -> str:
        if self._request_id is None:
            self._request_id = new_id("req-")
        return self._request_id

    @request_id.setter
    def request_id(self, value: str) -> None:
        self._request_id = value


_current: ContextVar[RequestContext | None] = ContextVar("polyhead_request", default=None)


def start_request(incoming: str | None) -> RequestContext:
    if incoming is not None and _VALID_ID.match(incoming):
        ctx = RequestContext(incoming, True)
    else:
        ctx = RequestContext(None, False)
    _current.set(ctx)
    return ctx


def current_request_id() -> str | None:
    ctx = _current.get()
    return ctx.request_id if ctx else None


def bind_request_id(request_id: str) -> None:
    """Use `request_id` as the correlation id, unless the client sent its own."""
    ctx = _current.get()
    if ctx is not None and not ctx.from_client:
        ctx.request_id = request_id


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = current_request_id()
        return True


def add_engine_time(seconds: float) -> None:
    """Record one choice's engine wait; parallel choices overlap, so the longest one counts."""
    ctx = _current.get()
    if ctx is not None:
        ctx.engine_s = max(ctx.engine_s, seconds)

"""Errors of the router package; server/errors.py maps them to HTTP."""

from __future__ import annotations


class RouterError(Exception):
    """Base error of the router package."""


class InvalidPolicy(RouterError):
    """A policy document failed validation; `field` is a dotted path such as `params.head`."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class UnknownHead(RouterError):
    """A request or a state update named a head that is not served."""

    def __init__(self, head: str, known: list[str] | tuple[str, ...]) -> None:
        super().__init__(f"unknown head {head!r} (known: {', '.join(known)})")
        self.head = head
        self.known = tuple(known)

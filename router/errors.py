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


class HeadUnavailable(RouterError):
    """The request needs a head that an operator drained, or every head is drained."""


class NoHeadHoldsIds(RouterError):
    """The request names token ids (stop_token_ids, logit_bias, allowed_token_ids) that no
    routable head's vocabulary holds."""

    def __init__(self, min_vocab: int) -> None:
        super().__init__(f"no routable head holds token id {min_vocab - 1}")
        self.min_vocab = min_vocab


class ReadingLacksLogits(RouterError):
    """The active policy routes to a two-level reading a request that needs every id's logit
    (a grammar, logit rules, alternatives), which a reading never materialises."""

    def __init__(self, head: str) -> None:
        super().__init__(f"the policy routes to {head}, a two-level reading, which does not "
                         "serve structured output, logit rules or top/prompt logprobs; pin "
                         "another head or change the policy")
        self.head = head


class VersionConflict(RouterError):
    """A policy change named a version that is no longer the active one (optimistic locking)."""

    def __init__(self, expected: int, active: int) -> None:
        super().__init__(f"policy version {expected} is stale; the active version is {active}")
        self.expected = expected
        self.active = active


class AdmissionRejected(RouterError):
    """The KV budget is full and the bounded queue could not place the request in time."""

    def __init__(self, head: str, retry_after_s: int, why: str) -> None:
        super().__init__(f"head {head} is at its KV-cache limit ({why}); "
                         f"retry after {retry_after_s} s")
        self.head = head
        self.retry_after_s = retry_after_s
        self.why = why


class InvalidForecast(RouterError):
    """A deployment forecast failed validation; `field` is a path such as `regimes[1].share`."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class CalibrationFileError(RouterError):
    """A step-sample calibration file is missing, unreadable or malformed."""

"""The gateway's own errors. Each already carries its HTTP status and OpenAI error type;
server.api.errors turns them, and the other packages' errors, into responses."""

from __future__ import annotations


class APIError(Exception):
    """An error raised by the gateway itself, already carrying its HTTP status."""

    status = 400
    type = "invalid_request_error"
    code: str | None = None

    def __init__(self, message: str, param: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.headers = headers or {}


class BadRequest(APIError):
    code = "bad_request"


class Unauthorized(APIError):
    status, type, code = 401, "authentication_error", "invalid_api_key"


class Forbidden(APIError):
    status, type, code = 403, "permission_error", "forbidden"


class NotFound(APIError):
    status, type, code = 404, "invalid_request_error", "model_not_found"


class PayloadTooLarge(APIError):
    status, code = 413, "payload_too_large"


class Conflict(APIError):
    status, code = 409, "conflict"


class Unavailable(APIError):
    status, type, code = 503, "server_error", "unavailable"


class TooManyRequests(APIError):
    """429; `reason` labels polyhead_admission_rejections_total (rate_limit, inflight, ...)."""

    status, type, code = 429, "rate_limit_error", "rate_limit_exceeded"

    def __init__(self, message: str, param: str | None = None, headers: dict | None = None,
                 reason: str = "other") -> None:
        super().__init__(message, param, headers)
        self.reason = reason


class NotServed(APIError):
    """501: this install cannot serve the feature asked for (a package it needs is missing)."""

    status, type, code = 501, "server_error", "not_implemented"


class InternalError(APIError):
    status, type, code = 500, "server_error", "internal_error"


class InvalidPolicyRequest(APIError):
    code = "invalid_policy"

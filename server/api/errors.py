"""The one place where errors become HTTP responses with OpenAI-style bodies.

Body: {"error": {"message", "type", "param", "code"}}. The other packages raise their own
errors (heads.errors, router.errors, kernels.errors); this module maps them to statuses.
"""

from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from heads.errors import (
    EngineError,
    EngineLost,
    EngineOverloaded,
    EngineStopped,
    EngineUnavailable,
    EngineUnsupported,
    GrammarError,
    MissingDependency,
    TokenizerError,
)
from kernels.errors import KernelError
from router.errors import (
    AdmissionRejected,
    HeadUnavailable,
    InvalidPolicy,
    NoHeadHoldsIds,
    ReadingLacksLogits,
    RouterError,
    UnknownHead,
    VersionConflict,
)
from server.errors import (
    APIError,
    BadRequest,
    Conflict,
    InternalError,
    InvalidPolicyRequest,
    NotFound,
    NotServed,
    TooManyRequests,
    Unavailable,
)
from server.schemas import UNSUPPORTED_FIELDS

log = logging.getLogger(__name__)


def error_body(message: str, type_: str, param: str | None, code: str | None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(
        error_body(err.message, err.type, err.param, err.code),
        status_code=err.status,
        headers=err.headers,
    )


def to_api_error(exc: Exception) -> APIError:
    """Map a domain error from heads/router/kernels to the status a client should see."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, UnknownHead):
        return NotFound(str(exc), param="model")
    if isinstance(exc, InvalidPolicy):
        return InvalidPolicyRequest(str(exc), param=exc.field)
    if isinstance(exc, VersionConflict):
        return Conflict(str(exc), param="if-match")
    if isinstance(exc, HeadUnavailable):
        return Unavailable(str(exc), param="model")
    if isinstance(exc, NoHeadHoldsIds | ReadingLacksLogits):
        return BadRequest(str(exc))
    if isinstance(exc, AdmissionRejected):
        return TooManyRequests(str(exc), headers={"Retry-After": str(exc.retry_after_s)},
                               reason="kv_budget")
    if isinstance(exc, EngineOverloaded):
        # The request can never fit the KV cache: a client error, like vLLM's context-length 400.
        return BadRequest(str(exc), param="max_tokens")
    if isinstance(exc, EngineUnsupported):
        return BadRequest(str(exc))
    if isinstance(exc, GrammarError):
        return BadRequest(str(exc), param="response_format")
    if isinstance(exc, MissingDependency):
        return NotServed(str(exc))
    if isinstance(exc, EngineStopped | EngineLost):
        return Unavailable(str(exc))
    if isinstance(exc, EngineUnavailable):
        # Health polls run every few seconds: a retry after that may find a replica back.
        return Unavailable(str(exc), headers={"Retry-After": "2"})
    if isinstance(exc, KernelError | TokenizerError):
        return BadRequest(str(exc))
    if isinstance(exc, EngineError | RouterError):
        return InternalError(str(exc))
    return InternalError("internal server error")


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    return f"{param or 'body'}: {first.get('msg', 'invalid value')}", param


def validation_error(exc: RequestValidationError) -> APIError:
    """Every invalid request is a 400, as vLLM answers it: a malformed body, an unknown
    field, invalid Unicode, something not served, or a known field with a bad value or one
    past a limit (code "invalid_value"), which the gateway's own limits answer alike."""
    errors = exc.errors()
    if errors and errors[0].get("type") == "json_invalid":
        return BadRequest("request body is not valid JSON")
    for e in errors:
        kind = e.get("type")
        loc = [str(p) for p in e.get("loc", ()) if p != "body"]
        if kind == "extra_forbidden":
            field = ".".join(loc)
            why = UNSUPPORTED_FIELDS.get(field)
            return BadRequest(f"{field}: {why}" if why else f"unknown field '{field}'",
                              param=field or None)
        if kind == "invalid_unicode":
            field = str((e.get("ctx") or {}).get("field", "body"))
            err = BadRequest(str(e.get("msg")), param=field)
            err.code = "invalid_unicode"
            return err
        if kind == "unsupported_value":
            where = ".".join(loc)
            return BadRequest(f"{where or 'body'}: {e.get('msg')}", param=where or None)
    message, param = _validation_message(exc)
    err = BadRequest(message, param=param)
    err.code = "invalid_value"
    return err


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        if isinstance(exc, TooManyRequests):  # read by the gateway middleware's metrics
            request.scope["polyhead.reject_reason"] = exc.reason
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else None
        err = APIError(str(exc.detail))
        err.status, err.code = exc.status_code, code
        return error_response(err)

    for domain in (RouterError, EngineError, KernelError, TokenizerError, GrammarError,
                   MissingDependency):

        @app.exception_handler(domain)
        async def _domain(request: Request, exc: Exception) -> JSONResponse:
            err = to_api_error(exc)
            if isinstance(err, TooManyRequests):  # e.g. router.errors.AdmissionRejected
                request.scope["polyhead.reject_reason"] = err.reason
            if isinstance(err, NotServed):  # the install, not a fault: no traceback
                log.warning("request refused: %s", exc)
            elif err.status >= 500:
                log.error("request failed: %s", exc, exc_info=exc)
            return error_response(err)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled error", exc_info=exc)
        return error_response(to_api_error(exc))


def sse_error(err: APIError) -> str:
    """An error event for a stream that already started (the status line was sent as 200)."""
    body = error_body(err.message, err.type, err.param, err.code)
    return f"data: {json.dumps(body)}\n\n"

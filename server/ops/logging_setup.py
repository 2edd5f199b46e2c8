"""Log handlers, configured once by the CLI: text for a terminal, JSON lines for deployment."""

from __future__ import annotations

import json
import logging
import sys
import time

from server.ops.request_context import RequestIdFilter


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None)
        if request_id is not None:  # set by RequestIdFilter inside a request
            out["request_id"] = request_id
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def configure_logging(fmt: str, level: str) -> None:
    handler = _StderrHandler()
    handler.addFilter(RequestIdFilter())
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # httpx logs every request at INFO: the vLLM backend's health polls would flood the log.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, root.level))


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at emit time, not at configuration time, so a
    redirected or replaced stderr (test capture, daemonizing) never leaves a closed stream."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value):
        pass

"""Run the app under uvicorn with a shutdown that exits 0 once in-flight requests drain."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI

from server.ops.logging_setup import configure_logging
from server.ops.readiness import Phase
from server.settings import Settings, load_settings

log = logging.getLogger(__name__)

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# How `serve_workers` hands its settings' sources to the worker processes it spawns.
WORKER_ARGS_ENV = "POLYHEAD_WORKER_ARGS"


class DrainingServer(uvicorn.Server):
    """uvicorn re-raises SIGTERM after its graceful shutdown, so the process ends 'killed by
    signal 15'. For Kubernetes and systemd a drained shutdown is a success: exit 0 instead.

    On the first SIGTERM/SIGINT `on_drain` runs at once (/readyz turns 503, new API requests
    get 503); the listener closes `delay_s` later, then in-flight requests get uvicorn's
    graceful-shutdown timeout to finish. A second signal skips the delay.
    """

    def __init__(self, config: uvicorn.Config, on_drain: Callable[[], None] = lambda: None,
                 delay_s: float = 0.0) -> None:
        super().__init__(config)
        self.on_drain = on_drain
        self.delay_s = delay_s
        self._exit_at: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._exit_at is None and self.delay_s > 0:
            self.on_drain()
            self._exit_at = time.monotonic() + self.delay_s
            return
        self.on_drain()
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        if self._exit_at is not None and time.monotonic() >= self._exit_at:
            self.should_exit = True
        return await super().on_tick(counter)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in _SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def serve(app: FastAPI, settings: Settings) -> None:
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_config=None,
                            timeout_graceful_shutdown=settings.shutdown_grace_s)

    def drain() -> None:
        app.state.lifecycle.phase = Phase.DRAINING

    DrainingServer(config, drain, settings.shutdown_delay_s).run()


def serve_workers(settings: Settings, config_file: Path | None, flags: dict[str, Any]) -> None:
    """`settings.workers` uvicorn processes on one socket. Each worker rebuilds the settings
    from the same sources (config file, environment, these CLI flags), then its own app."""
    if settings.redis_url is None:
        log.warning("%d workers without redis_url: each keeps its own rate limits, usage, λ "
                    "and policy", settings.workers)
    os.environ[WORKER_ARGS_ENV] = json.dumps(
        {"config": None if config_file is None else str(config_file), "flags": flags})
    uvicorn.run("server.serving:worker_app", factory=True, host=settings.host,
                port=settings.port, workers=settings.workers, log_config=None,
                timeout_graceful_shutdown=settings.shutdown_grace_s)


def worker_app() -> FastAPI:
    """uvicorn's app factory in each worker process of `serve_workers`."""
    from server.bootstrap import create_app

    args = json.loads(os.environ[WORKER_ARGS_ENV])
    settings = load_settings(None if args["config"] is None else Path(args["config"]),
                             **args["flags"])
    configure_logging(settings.log_format, settings.log_level)
    return create_app(settings)

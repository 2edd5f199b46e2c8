"""polyhead bench gateway: what the gateway adds on top of the engine.

Each backend gets its own `polyhead serve` process on loopback; an async httpx client in
this process is the load generator:
- latency: an open loop at a fixed rate; added latency per request = client latency minus
  the engine's wait that the gateway reports in `server-timing: engine;dur=...`;
- throughput: a closed loop at fixed concurrency on raw sockets (server.bench.raw_load); the
  sustained completions/s and the server's CPU per completion, for the gateway with one and
  with two uvicorn workers, and for the framework floor (a bare FastAPI endpoint);
- streams: N concurrent SSE streams held open (echo backend with a per-token delay);
- features: what request-aware routing adds (the prompt tokenized with every head before the
  decision), as the added latency of a 2 KB prompt on the echo backend under a content-blind
  policy (one head tokenized, after the decision) and a request-aware one, in the same run,
  plus the encode itself timed in process.
The load generator shares the machine with the gateway, so the figures are conservative.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from server.bench.raw_load import closed_loop_raw

BODY = {"model": "tiny", "prompt": "bench", "max_tokens": 1, "temperature": 0}


@dataclass
class Result:
    backend: str
    phase: str
    requests: int
    errors: int
    seconds: float
    rps: float
    p50_ms: float | None = None
    p99_ms: float | None = None
    added_p50_ms: float | None = None
    added_p99_ms: float | None = None
    cpu_ms_per_req: float | None = None  # server process (and children) utime+stime / reqs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1e3


def _engine_s(r: httpx.Response) -> float:
    for part in r.headers.get("server-timing", "").split(","):
        name, _, dur = part.strip().partition(";dur=")
        if name == "engine" and dur:
            return float(dur) / 1e3
    return 0.0


@dataclass
class Served:
    url: str
    pid: int


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids += [int(x) for x in f.read().split()]
    except OSError:
        return []
    return kids + [k for c in kids for k in _children(c)]


def cpu_seconds(pid: int) -> float:
    """utime+stime of `pid` and its live descendants (uvicorn workers), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for p in [pid, *_children(pid)]:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


@contextmanager
def served(cmd: list[str], env: dict[str, str], port: int, log: Path,
           ready_path: str = "/readyz", ready_s: float = 120) -> Iterator[Served]:
    """A server subprocess on loopback, once `ready_path` answers 200."""
    proc = subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(int(ready_s / 0.2)):
            if proc.poll() is not None:
                raise RuntimeError(f"server exited: {log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}{ready_path}", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        yield Served(url, proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def own_state(env: dict[str, str], log: Path) -> dict[str, str]:
    """`env` plus a λ counters file and an audit log beside `log`, each unless the caller
    chose where it lives (a cache dir, the file itself, or Redis for λ).

    A gateway started for a test or a bench must not write the user's own state under
    <cache_dir>: its served bytes and learned output bytes/token would steer the user's next
    `polyhead serve`, and its admin actions would sit in the user's audit trail. The model
    cache stays shared, so the demo is reused.
    """
    if "POLYHEAD_CACHE_DIR" in env:
        return env
    out = dict(env)
    if not {"POLYHEAD_LAMBDA_STORE", "POLYHEAD_REDIS_URL"} & env.keys():
        out["POLYHEAD_LAMBDA_STORE"] = str(log.with_name(f"{log.stem}-lambda.json"))
    out.setdefault("POLYHEAD_AUDIT_LOG", str(log.with_name(f"{log.stem}-audit.jsonl")))
    return out


def _gateway_env(model: str, port: int, log: Path, env: dict[str, str]) -> dict[str, str]:
    return {**os.environ, "POLYHEAD_MODEL": model, "POLYHEAD_PORT": str(port),
            "POLYHEAD_HOST": "127.0.0.1", "POLYHEAD_LOG_LEVEL": "WARNING",
            **own_state(env, log)}


@contextmanager
def gateway_process(model: str, port: int, log: Path, **env: str) -> Iterator[Served]:
    with served([sys.executable, "-m", "server.cli", "serve"], _gateway_env(model, port, log, env),
                port, log) as s:
        yield s


@contextmanager
def gateway(model: str, port: int, log: Path, **env: str) -> Iterator[str]:
    with gateway_process(model, port, log, **env) as s:
        yield s.url


@contextmanager
def floor(port: int, log: Path) -> Iterator[Served]:
    """The framework floor: server.bench.floor_app under uvicorn, as the gateway is."""
    with served([sys.executable, "-m", "server.bench.floor_app", str(port)], dict(os.environ),
                port, log) as s:
        yield s


async def open_loop(url: str, backend: str, rps: float, seconds: float,
                    body: dict | None = None, phase: str = "latency") -> Result:
    body = body or BODY
    lat, added, errors = [], [], 0
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        for _ in range(20):  # warm-up: connections, code paths
            await client.post(f"{url}/v1/completions", json=body)

        async def one() -> None:
            nonlocal errors
            t0 = time.perf_counter()
            r = await client.post(f"{url}/v1/completions", json=body)
            dt = time.perf_counter() - t0
            if r.status_code != 200:
                errors += 1
                return
            lat.append(dt)
            added.append(max(0.0, dt - _engine_s(r)))

        n = int(rps * seconds)
        start = time.perf_counter()
        tasks = []
        for i in range(n):
            delay = start + i / rps - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one()))
        await asyncio.gather(*tasks)
        took = time.perf_counter() - start
    return Result(backend, f"{phase}@{rps:g}rps", n, errors, took, len(lat) / took,
                  _pct(lat, 0.5), _pct(lat, 0.99), _pct(added, 0.5), _pct(added, 0.99))


async def closed_loop(url: str, backend: str, concurrency: int, seconds: float,
                      pid: int | None = None, body: dict | None = None) -> Result:
    """Max req/s through server.bench.raw_load (a light client, so the server saturates
    first); `pid`: the server process whose CPU time per completed request is measured."""
    r = await closed_loop_raw(url, "/v1/completions", body or BODY, concurrency, seconds,
                              None if pid is None else lambda: cpu_seconds(pid))
    return Result(backend, f"max-rps@c{concurrency}", r.ok + r.errors, r.errors, r.seconds,
                  r.ok / r.seconds, _pct(r.latencies_s, 0.5), _pct(r.latencies_s, 0.99),
                  cpu_ms_per_req=None if r.cpu_s is None or not r.ok else r.cpu_s / r.ok * 1e3)


async def hold_streams(url: str, n: int, tokens: int) -> Result:
    ok, errors = 0, 0
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        body = {**BODY, "max_tokens": tokens, "stream": True}

        async def one() -> None:
            nonlocal ok, errors
            try:
                async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
                    last = ""
                    async for line in r.aiter_lines():
                        if line.startswith("data: "):
                            last = line
                    ok += r.status_code == 200 and last == "data: [DONE]"
                    errors += not (r.status_code == 200 and last == "data: [DONE]")
            except httpx.HTTPError:
                errors += 1

        start = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
        took = time.perf_counter() - start
    return Result("echo", f"{n} concurrent SSE streams", n, errors, took, ok / took)


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), platform.processor())
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform()}


def table(rows: list[Result]) -> str:
    head = (f"{'backend':8} {'phase':26} {'reqs':>6} {'err':>4} {'req/s':>8} {'p50 ms':>8} "
            f"{'p99 ms':>8} {'added p50':>10} {'added p99':>10} {'cpu ms/req':>10}")

    def f(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    lines = [head] + [
        f"{r.backend:8} {r.phase:26} {r.requests:6d} {r.errors:4d} {r.rps:8.1f} {f(r.p50_ms):>8} "
        f"{f(r.p99_ms):>8} {f(r.added_p50_ms):>10} {f(r.added_p99_ms):>10} "
        f"{f(r.cpu_ms_per_req):>10}" for r in rows]
    return "\n".join(lines)


def write(rows: list[Result], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "bench_gateway.json"
    path.write_text(json.dumps({"machine": machine(), "rows": [asdict(r) for r in rows]},
                               indent=2))
    return path


def request_body(model_name: str, prompt_bytes: int) -> dict:
    """The timed phases' request: a one-token completion of the short "bench" prompt, or of
    the first `prompt_bytes` of a committed Wikipedia sample (tokenized with every head when
    the policy is request-aware)."""
    if prompt_bytes <= 0:
        return {**BODY, "model": model_name}
    from heads.data.files import WIKI_SAMPLE_B

    raw = WIKI_SAMPLE_B.read_bytes()[:prompt_bytes]
    text = raw.decode("utf-8", "ignore")  # a cut multi-byte character is dropped
    return {**BODY, "model": model_name, "prompt": text}


FEATURES_TARGET_MS = 1.0  # request-aware routing may add this much p50, 2 KB over 3 heads
FEATURES = ("blind", "request")


def features_policy(features: str) -> str:
    return json.dumps({"name": "lifecycle", "params": {"features": features}})


def encode_p50_ms(model_dir: Path, text: str, rounds: int = 300) -> float:
    """In process: the prompt tokenized with every head (heads.vocab.prompt_encoder), p50 ms."""
    from heads.checkpoint import load_metadata
    from heads.vocab.prompt_encoder import PromptEncoder

    manifest, tokenizers = load_metadata(model_dir)
    encoder = PromptEncoder(tokenizers, {h.name: h.bos_token_id for h in manifest.heads})
    try:
        for _ in range(30):
            encoder.encode([text], chat=False)
        took = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            encoder.encode([text], chat=False)
            took.append(time.perf_counter() - t0)
    finally:
        encoder.close()
    return _pct(took, 0.5)


def features_summary(rows: list[Result], encode_ms: float | None) -> str:
    by = {r.backend: r for r in rows if r.phase.startswith("2KB prompt")}
    blind, aware = by.get("echo/blind"), by.get("echo/request")
    if blind is None or aware is None or None in (blind.added_p50_ms, aware.added_p50_ms):
        return ""
    assert blind.added_p50_ms is not None and aware.added_p50_ms is not None
    delta = aware.added_p50_ms - blind.added_p50_ms
    verdict = "MET" if delta <= FEATURES_TARGET_MS else "MISSED"
    encode = "" if encode_ms is None else f"; in-process encode over every head p50 " \
                                          f"{encode_ms:.3f} ms"
    return (f"request-aware routing adds {delta:+.3f} ms p50 over content-blind "
            f"({aware.added_p50_ms:.3f} vs {blind.added_p50_ms:.3f} ms added; target "
            f"<= {FEATURES_TARGET_MS:g} ms): {verdict}{encode}")


def summary(rows: list[Result]) -> str:
    lat = [r for r in rows if r.backend == "echo" and r.phase.startswith("latency")]
    p50 = lat[0].added_p50_ms if lat else None
    p99 = lat[0].added_p99_ms if lat else None
    if p50 is None or p99 is None:
        return ""
    r = lat[0]
    return (f"targets at {r.phase}: added p50 {p50:.2f} ms (< 2 ms: {p50 < 2}), "
            f"added p99 {p99:.2f} ms (< 10 ms: {p99 < 10})")


CPU_TARGET_X = 2.0  # gateway CPU per request at most this many times the framework floor's
# The same with a 2 KB prompt, tokenized with every head (request-aware routing): the floor
# only parses the JSON, so the gateway's tokenizing and pricing count against it.
CPU_LONG_PROMPT_TARGET_X = 3.0
P99_TARGET_MS = 10.0  # added p99 at the open-loop rate
WORKERS_TARGET_RPS = 1000.0  # max req/s of the echo gateway with 2 uvicorn workers


def _row(rows: list[Result], backend: str, phase: str) -> Result | None:
    return next((r for r in rows if r.backend == backend and r.phase.startswith(phase)), None)


def targets(rows: list[Result], workers_note: str = "", prompt_bytes: int = 0) -> list[str]:
    """MET or MISSED per target, from this run's rows; a target without its row is MISSED.
    `prompt_bytes` > 0: the timed phases sent that long a prompt, so the CPU target is
    CPU_LONG_PROMPT_TARGET_X."""
    def verdict(ok: bool) -> str:
        return "MET" if ok else "MISSED"

    out = []
    x, what = ((CPU_LONG_PROMPT_TARGET_X, f" ({prompt_bytes} B prompt)") if prompt_bytes > 0
               else (CPU_TARGET_X, ""))
    gw, fl = _row(rows, "echo", "max-rps"), _row(rows, "floor", "max-rps")
    if gw and fl and gw.cpu_ms_per_req is not None and fl.cpu_ms_per_req:
        ratio = gw.cpu_ms_per_req / fl.cpu_ms_per_req
        out.append(f"target CPU per request <= {x:g}x floor{what}: {gw.cpu_ms_per_req:.3f} "
                   f"vs {fl.cpu_ms_per_req:.3f} ms ({ratio:.2f}x): {verdict(ratio <= x)}")
    else:
        out.append(f"target CPU per request <= {x:g}x floor{what}: not measured: MISSED")
    lat = _row(rows, "echo", "latency")
    if lat and lat.added_p99_ms is not None:
        out.append(f"target added p99 < {P99_TARGET_MS:g} ms at {lat.phase.split('@')[1]}: "
                   f"{lat.added_p99_ms:.2f} ms: {verdict(lat.added_p99_ms < P99_TARGET_MS)}")
    else:
        out.append(f"target added p99 < {P99_TARGET_MS:g} ms: not measured: MISSED")
    w2 = _row(rows, "echo/2w", "max-rps")
    if w2:
        out.append(f"target >= {WORKERS_TARGET_RPS:g} req/s with 2 workers: {w2.rps:.1f} req/s: "
                   f"{verdict(w2.rps >= WORKERS_TARGET_RPS)}")
    else:
        note = f" ({workers_note})" if workers_note else ""
        out.append(f"target >= {WORKERS_TARGET_RPS:g} req/s with 2 workers: not measured{note}: "
                   "MISSED")
    return out

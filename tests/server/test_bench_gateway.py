"""polyhead bench gateway: the floor row, the cpu column and the target lines exist (their
values depend on the machine, so only their presence and shape are checked)."""

from __future__ import annotations

import asyncio
import os

import pytest

from server.bench.gateway import (
    Result,
    closed_loop,
    cpu_seconds,
    floor,
    free_port,
    open_loop,
    table,
    targets,
)


def _rows() -> list[Result]:
    return [
        Result("floor", "latency@200rps", 100, 0, 1.0, 100.0, 1.0, 2.0, 1.0, 2.0),
        Result("floor", "max-rps@c32", 500, 0, 1.0, 500.0, 5.0, 9.0, cpu_ms_per_req=0.3),
        Result("echo", "latency@200rps", 100, 0, 1.0, 100.0, 2.0, 4.0, 1.5, 3.5),
        Result("echo", "max-rps@c32", 300, 0, 1.0, 300.0, 9.0, 20.0, cpu_ms_per_req=0.9),
    ]


def test_table_has_floor_row_and_cpu_column() -> None:
    out = table(_rows()).splitlines()
    assert "cpu ms/req" in out[0]
    assert any(line.startswith("floor") and "max-rps" in line and "0.30" in line
               for line in out)


def test_target_lines() -> None:
    lines = targets(_rows(), "no workers setting")
    assert len(lines) == 3
    assert lines[0].startswith("target CPU per request <= 2x floor") and "3.00x" in lines[0]
    assert lines[0].endswith(": MISSED")
    assert lines[1].startswith("target added p99 < 10 ms at 200rps") and lines[1].endswith("MET")
    assert lines[2].startswith("target >= 1000 req/s with 2 workers")
    assert "no workers setting" in lines[2] and lines[2].endswith(": MISSED")
    two = [*_rows(), Result("echo/2w", "max-rps@c32", 1200, 0, 1.0, 1200.0, 1.0, 2.0)]
    assert targets(two)[2].endswith(": MET")
    assert all(line.endswith(": MISSED") for line in targets([]))


def test_cpu_seconds_of_this_process() -> None:
    before = cpu_seconds(os.getpid())
    sum(i * i for i in range(200_000))
    assert cpu_seconds(os.getpid()) > before or before > 0


@pytest.mark.integration
def test_floor_app_phases(tmp_path) -> None:
    port = free_port()
    with floor(port, tmp_path / "floor.log") as srv:
        lat = asyncio.run(open_loop(srv.url, "floor", 50, 0.2))
        cl = asyncio.run(closed_loop(srv.url, "floor", 4, 0.5, srv.pid))
    assert lat.errors == 0 and lat.added_p99_ms is not None
    assert cl.errors == 0 and cl.requests > 0
    assert cl.cpu_ms_per_req is not None and cl.cpu_ms_per_req > 0


def test_long_prompt_runs_are_held_to_the_3x_target() -> None:
    line = targets(_rows(), "", prompt_bytes=2048)[0]
    assert line.startswith("target CPU per request <= 3x floor (2048 B prompt)")
    assert "3.00x" in line and line.endswith(": MET")


def test_request_body_names_the_model_and_cuts_the_prompt() -> None:
    from server.bench.gateway import request_body

    assert request_body("gemma3-270m", 0)["prompt"] == "bench"
    body = request_body("gemma3-270m", 2048)
    assert body["model"] == "gemma3-270m" and body["max_tokens"] == 1
    assert 2040 <= len(body["prompt"].encode()) <= 2048


def test_a_bench_or_test_gateway_keeps_its_own_lambda_counters_and_audit(tmp_path) -> None:
    from server.bench.gateway import own_state

    log = tmp_path / "echo.log"
    assert own_state({"POLYHEAD_BACKEND": "echo"}, log) == {
        "POLYHEAD_BACKEND": "echo", "POLYHEAD_LAMBDA_STORE": str(tmp_path / "echo-lambda.json"),
        "POLYHEAD_AUDIT_LOG": str(tmp_path / "echo-audit.jsonl")}
    assert own_state({"POLYHEAD_CACHE_DIR": "/c"}, log) == {"POLYHEAD_CACHE_DIR": "/c"}
    for chosen in ({"POLYHEAD_LAMBDA_STORE": "/l.json"}, {"POLYHEAD_REDIS_URL": "redis://x"}):
        got = own_state(chosen, log)  # the caller chose where λ lives
        assert got == {**chosen, "POLYHEAD_AUDIT_LOG": str(tmp_path / "echo-audit.jsonl")}

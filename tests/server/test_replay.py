"""Real-engine replay on the tiny model: every policy and static head serves the whole trace,
and the accounting adds up. No timed assertions (CPU timings are noisy)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from heads.manifest import Manifest
from heads.model.weights import load_checkpoint
from router.simulate.traces import SimRequest
from router.step_time_file import StepSamples, write_step_samples
from router.step_time_fit import FittedStepTimer
from server.bench.replay.report import regime_table, table, targets, write_csv
from server.bench.replay.runner import ReplayConfig
from server.bench.replay.session import replay_all
from server.bootstrap import build_router, device_spec, head_profiles
from server.settings import Settings

# Three at once (B=3), then one at a time: two regimes by trace time.
TRACE = [SimRequest(0.0, 120, 60, 16), SimRequest(0.0, 200, 40, 16),
         SimRequest(0.05, 80, 80, 16), SimRequest(0.6, 100, 30, 8), SimRequest(0.9, 60, 50, 8)]


def test_replay_every_policy_and_static_head(tiny_model_dir: Path, tmp_path: Path) -> None:
    ckpt = load_checkpoint(tiny_model_dir, compute_dtype="float32")
    rows = asyncio.run(replay_all(ckpt, TRACE, ["lifecycle", "cost"], ReplayConfig(
        max_num_seqs=4, kv_cache_mb=8, poll_s=0.02), lambda t: "high" if t < 0.5 else "low"))
    assert [r.policy for r in rows] == ["lifecycle", "cost", "static:1k", "static:4k",
                                        "static:8k"]
    for r in rows:
        res = r.real.result
        assert len(res.latencies) == len(TRACE) and res.output_bytes > 0  # nothing dropped
        assert res.device_s > 0 and res.steps > 0 and res.max_batch >= 1
        assert sum(r.real.head_tokens.values()) == sum(r.real.regime_tokens.values())
        assert sum(r.real.regime_s.values()) == res.device_s
        assert set(r.sims) == {"sim (analytic)", "sim (charged measured)"}
        assert all(len(s.latencies) == len(TRACE) for s in r.sims.values())
        if r.policy.startswith("static:"):
            assert res.share()[r.policy[7:]] == 1.0 and res.switches == 0
    text = table(rows) + regime_table(rows)
    assert "static:8k" in text and "sim (analytic)" in text
    assert len(targets(rows, ["lifecycle", "cost"])) >= 1
    write_csv(rows, tmp_path / "replay.csv")
    lines = (tmp_path / "replay.csv").read_text().splitlines()
    assert len(lines) == 1 + 5 * 3  # header + (real + two sims) per row


def test_serve_settings_seed_the_router_from_a_calibration_file(tiny_model_dir: Path,
                                                                tmp_path: Path) -> None:
    from router.step_time_fit import StepSample

    manifest = Manifest.load(tiny_model_dir)
    profiles = head_profiles(manifest, "float32")
    samples = tuple(StepSample(((p.name, b, 50.0),), 1e-3 * b) for p in profiles
                    for b in (1, 2, 4))
    path = write_step_samples(tmp_path / "steps.json",
                              StepSamples(device_spec("auto"), tuple(profiles), samples))
    router, _ = build_router(manifest, Settings(calibration_file=path, cache_dir=tmp_path))
    assert isinstance(router.timer, FittedStepTimer) and router.timer.sample_count == 9
    router, _ = build_router(manifest, Settings(cache_dir=tmp_path))
    assert isinstance(router.timer, FittedStepTimer) and router.timer.sample_count == 0


def test_levels_run_closed_loop_and_account_for_every_second(tiny_model_dir: Path,
                                                              tmp_path: Path) -> None:
    from server.bench.replay.breakdown import parts
    from server.bench.replay.level_run import replay_levels, report

    ckpt = load_checkpoint(tiny_model_dir, compute_dtype="float32")
    trace = [SimRequest(0.0, 80 + 10 * i, 40, 8, "en" if i % 2 else "de") for i in range(6)]
    labels = ["lifecycle", "static:1k", "static:8k"]
    lvls = asyncio.run(replay_levels(ckpt, trace, labels, [1, 3], ReplayConfig(
        max_num_seqs=4, kv_cache_mb=8, poll_s=0.02), rounds=2))
    assert [lv.clients for lv in lvls] == [1, 3]
    one, three = lvls
    assert all(r.real.mean_batch == 1.0 for r in one.rows)  # one client: B=1 every step
    assert max(r.real.result.max_batch for r in three.rows) > 1
    for lv in lvls:
        assert [r.policy for r in lv.rows] == labels and lv.name.startswith("B=")
        for r in lv.rows:
            assert len(r.runs) == 2 and r.real in r.runs
            res = r.real
            assert len(res.served) == len(trace) and len(res.bpb) == len(trace)
            assert res.prefill_s + res.decode_s == pytest.approx(res.result.device_s)
            p = parts(res)
            assert sum(p.values()) == pytest.approx(res.wall_s, rel=0.02, abs=0.01)
            assert res.score_s >= 0 and res.inflight_s <= res.wall_s + 1e-9
    text, checks = report(lvls, "lifecycle", "static:8k", False, "multilingual", tmp_path)
    assert "decode s/MB" in text and "not dominated" in text
    assert len(checks) == 2 + 1  # dominance at both levels, the low-load cost target
    assert (tmp_path / "bench_replay_multilingual_c1.png").stat().st_size > 1000
    assert (tmp_path / "bench_replay_multilingual_levels.json").is_file()


def test_a_two_level_reading_replays_and_is_scored_on_native_ids(tiny_model_dir: Path) -> None:
    import math

    from server.bench.replay.level_run import replay_levels
    from server.bench.replay.quality import continuation_bits

    ckpt = load_checkpoint(tiny_model_dir, compute_dtype="float32").with_readings(["1k"])
    trace = [SimRequest(0.0, 80 + 10 * i, 40, 8, "en") for i in range(4)]
    labels = ["lifecycle", "static:1k+groups", "static:8k"]
    [lv] = asyncio.run(replay_levels(ckpt, trace, labels, [2], ReplayConfig(
        max_num_seqs=4, kv_cache_mb=8, poll_s=0.02), rounds=1))
    reading = next(r for r in lv.rows if r.policy == "static:1k+groups").real
    assert {s.head for s in reading.served} == {"1k+groups"}
    assert all(s.tokens > 0 for s in reading.served)
    assert all(math.isfinite(b) and b > 0 for b in reading.bpb)
    # Its bits are the two-level reading's, not the native head's on the same native ids.
    prompt, rest = "The quick brown fox", " jumps over the lazy dog."
    assert continuation_bits(ckpt, "1k+groups", prompt, rest) != \
        pytest.approx(continuation_bits(ckpt, "8k", prompt, rest))


@pytest.mark.vllm
def test_stock_vllm_replays_the_same_requests_on_the_native_head(tiny_model_dir: Path,
                                                                 tmp_path: Path) -> None:
    """Stock vLLM (its own server, the native head's per-head export) serves the same
    requests as static:8k, held to the same lengths, scored on the same head, and is
    judged on wall seconds in flight at the low level; a second stock server on the 4k
    head's export serves the stock-vllm:4k label."""
    from server.bench.replay.level_run import replay_levels, report
    from server.bench.replay.stock import stock_vllm

    ckpt = load_checkpoint(tiny_model_dir, compute_dtype="float32")
    trace = [SimRequest(0.0, 80 + 10 * i, 40, 8, "en" if i % 2 else "de") for i in range(4)]
    labels = ["lifecycle", "static:1k", "static:8k", "stock-vllm:8k", "stock-vllm:4k"]

    async def run() -> list:
        async with stock_vllm(tiny_model_dir, ckpt.manifest, tmp_path / "cache",
                              tmp_path / "stock.log") as native, \
                stock_vllm(tiny_model_dir, ckpt.manifest, tmp_path / "cache",
                           tmp_path / "stock-4k.log", "4k") as smaller:
            return await replay_levels(ckpt, trace, labels, [1], ReplayConfig(
                max_num_seqs=4, kv_cache_mb=8, poll_s=0.02), rounds=1,
                stock={"8k": native, "4k": smaller})

    [lv] = asyncio.run(run())
    rows = {r.policy: r.real for r in lv.rows}
    stock, local = rows["stock-vllm:8k"], rows["static:8k"]
    assert {s.head for s in stock.served} == {"8k"}
    assert {s.head for s in rows["stock-vllm:4k"].served} == {"4k"}
    assert [s.tokens for s in stock.served] == [s.tokens for s in local.served]
    assert stock.bpb == local.bpb  # the same continuations under the same head
    assert stock.result.device_s == 0 and stock.inflight_s > 0  # no steps seen; wall charged
    assert lv.name == "B=1.0 (1 client)"
    text, checks = report([lv], "lifecycle", "static:8k", False, "multilingual", tmp_path)
    assert [c for c in checks if "stock-vllm:8k's in-flight s/MB" in c[0]]
    assert "stock-vllm:8k" in text


def test_laddered_requests_replay_with_their_moves_and_each_token_scored_on_its_head(
        tiny_model_dir: Path) -> None:
    import math

    from server.bench.replay.runner import Replayer

    ckpt = load_checkpoint(tiny_model_dir, compute_dtype="float32").with_readings(["1k", "4k"])
    trace = [SimRequest(0.0, 120 + 10 * i, 60, 10, "en") for i in range(4)]
    cfg = ReplayConfig(max_num_seqs=4, kv_cache_mb=8, poll_s=0.02, probe_every=1)
    profiles = head_profiles(ckpt.manifest, ckpt.model.dtype_name, probe_every=1)
    # Every request sent to the cheapest reading under a quality bound: the router hands the
    # engine a ladder for each (which head a cost policy picks depends on live timings).
    doc = {"name": "weighted", "params": {"weights": {"1k+groups": 1}}}

    async def run():
        replayer = Replayer(ckpt, profiles, cfg,
                            lambda: FittedStepTimer(device_spec("auto"), profiles))
        await replayer.warm_up()
        try:
            res = await replayer.run(trace, doc, "weighted", lambda t: "all", 2)
            replayer.score(trace, {(s.index, h) for s in res.served for h in s.heads})
            return res, [replayer.served_bpb(s) for s in res.served]
        finally:
            await replayer.close()

    res, bpb = asyncio.run(run())
    # Each request's spans name the rungs that sampled its tokens, from its first token (a
    # prefill move leaves one span, on the rung it moved to).
    assert all(s.spans for s in res.served)
    assert all({h for _, h in s.spans} <= {"1k+groups", "4k+groups", "8k"} for s in res.served)
    assert all(s.head == s.spans[-1][1] and s.spans[0][0] == 0 for s in res.served)
    assert sum(res.head_tokens.values()) == sum(s.tokens for s in res.served)
    assert all(math.isfinite(b) and b > 0 for b in bpb)


def test_served_bpb_reads_each_token_under_the_head_that_served_it() -> None:
    import types

    import torch

    from server.bench.replay.runner import Replayer, Served

    bits = {(0, "a"): (torch.tensor([1.0, 1.0, 1.0, 1.0], dtype=torch.float64), 8),
            (0, "b"): (torch.tensor([3.0, 3.0, 3.0, 3.0], dtype=torch.float64), 8)}
    fake = types.SimpleNamespace(_bits=bits)
    moved = Served(0, "en", "b", 4, 8, None, None, 0.1, ((0, "a"), (1, "b")))
    assert Replayer.served_bpb(fake, moved) == pytest.approx((1 + 3 * 3) / 8)  # type: ignore[arg-type]
    plain = Served(0, "en", "a", 4, 8, None, None, 0.1)
    assert Replayer.served_bpb(fake, plain) == pytest.approx(4 / 8)  # type: ignore[arg-type]

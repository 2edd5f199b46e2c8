"""Real-engine replay on the tiny model, through `polyhead bench replay`: every policy and
static head serves the whole trace, and the accounting adds up. No timed assertions (CPU
timings are noisy)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from heads.manifest import Manifest
from router.calibration import CalibratedTimer
from router.calibration_file import StepSamples, write_step_samples
from server.settings import Settings
from server.wiring import build_router, device_spec, head_profiles

ROOT = Path(__file__).resolve().parents[2]
# Three at once (B=3), then one at a time: (arrival_s, prompt_bytes, output_bytes, max_tokens).
TRACE = [(0.0, 120, 60, 16), (0.0, 200, 40, 16), (0.05, 80, 80, 16), (0.6, 100, 30, 8),
         (0.9, 60, 50, 8)]


def test_replay_every_policy_and_static_head(tiny_model_dir: Path, tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,prompt_bytes,output_bytes,max_tokens\n"
                     + "".join(",".join(map(str, r)) + "\n" for r in TRACE))
    env = {**os.environ, "POLYHEAD_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "server.cli", "bench", "replay",
                           "--model", str(tiny_model_dir), "--trace", str(trace),
                           "--policies", "lifecycle,cost", "--max-num-seqs", "4",
                           "--out", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    lines = (tmp_path / "bench_replay.csv").read_text().splitlines()
    assert len(lines) == 1 + 5 * 3  # header + (real + two sims) per row
    rows = list(csv.DictReader(lines))
    real = [r for r in rows if r["source"] == "real"]
    assert [r["policy"] for r in real] == ["lifecycle", "cost", "static:1k", "static:4k",
                                           "static:8k"]
    for r in real:
        assert int(r["requests"]) == len(TRACE) and int(r["output_bytes"]) > 0  # nothing dropped
        # max_batch counts decode steps only: >= 1 means steps were taken
        assert float(r["device_s"]) > 0 and int(r["max_batch"]) >= 1
        # one regime ("all"): its tokens are every head's tokens and its time the device time
        assert float(r["cost_all"]) == pytest.approx(float(r["cost_s_per_mb"]), rel=1e-9)
        sims = [s for s in rows if s["policy"] == r["policy"] and s["source"] != "real"]
        assert {s["source"] for s in sims} == {"sim (analytic)", "sim (charged measured)"}
        assert all(int(s["requests"]) == len(TRACE) for s in sims)
        if r["policy"].startswith("static:"):
            row = next(ln for ln in text.splitlines() if ln.startswith(r["policy"] + " "))
            share = dict(kv.split("=") for kv in row.rsplit("  ", 1)[1].split())  # share (real)
            assert float(share[r["policy"][7:]]) == 1.0 and int(r["switches"]) == 0
    assert "static:8k" in text and "sim (analytic)" in text
    assert text.count("  MET ") + text.count("  MISSED ") >= 1


def test_serve_settings_seed_the_router_from_a_calibration_file(tiny_model_dir: Path,
                                                                tmp_path: Path) -> None:
    from router.calibration import StepSample

    manifest = Manifest.load(tiny_model_dir)
    profiles = head_profiles(manifest, "float32")
    samples = tuple(StepSample(((p.name, b, 50.0),), 1e-3 * b) for p in profiles
                    for b in (1, 2, 4))
    path = write_step_samples(tmp_path / "steps.json",
                              StepSamples(device_spec("auto"), tuple(profiles), samples))
    router, _ = build_router(manifest, Settings(calibration_file=path, cache_dir=tmp_path))
    assert isinstance(router.timer, CalibratedTimer) and router.timer.sample_count == 9
    router, _ = build_router(manifest, Settings(cache_dir=tmp_path))
    assert isinstance(router.timer, CalibratedTimer) and router.timer.sample_count == 0

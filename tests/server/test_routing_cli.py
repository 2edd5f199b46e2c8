"""Quick runs of `polyhead simulate` and `polyhead bench router`, so they do not rot."""

from __future__ import annotations

import json

from server.cli import main


def test_simulate_edge_quick(tmp_path, capsys) -> None:
    assert main(["simulate", "--trace", "edge", "--duration", "60", "--device", "a10g",
                 "--out", str(tmp_path), "--no-plot"]) == 0
    assert "static:32k" in capsys.readouterr().out
    assert (tmp_path / "simulate-edge.csv").exists()


def test_bench_router_quick(tmp_path) -> None:
    assert main(["bench", "router", "--quick", "--out", str(tmp_path)]) == 0
    table = json.loads((tmp_path / "bench-router.json").read_text())
    assert set(table) == {"pinned", "lifecycle", "cost", "threshold", "weighted"}


def test_simulate_multilingual_charges_measured_steps(tmp_path, capsys, tiny_model_dir) -> None:
    """Routed by the analytic model, charged both by it and by measured step times."""
    from heads.checkpoint import load_metadata
    from router.calibration import StepSample
    from router.calibration_file import StepSamples, write_step_samples
    from router.cost import Group, mixed_step_cost
    from router.devices import DEVICES
    from server.wiring import head_profiles

    profiles = head_profiles(load_metadata(tiny_model_dir)[0], "float32")
    dev = DEVICES["cpu"]
    samples = tuple(StepSample(((p.name, b, 100.0),),
                               3 * mixed_step_cost([Group(p, b, 100.0)], dev).optimistic_s)
                    for p in profiles for b in (1, 2, 4, 8, 16))
    path = write_step_samples(tmp_path / "steps.json", StepSamples(
        dev, tuple(profiles), samples, {"model": "tiny", "threads": 1}))
    assert main(["simulate", "--trace", "multilingual", "--duration", "40", "--calibration",
                 str(path), "--model", str(tiny_model_dir), "--out", str(tmp_path),
                 "--no-plot"]) == 0
    out = capsys.readouterr().out
    assert "charged by self-scored step times" in out and "charged by measured" in out
    assert "lifecycle:blind" in out
    rows = (tmp_path / "simulate-multilingual.csv").read_text().splitlines()
    assert any("/measured" in r for r in rows) and any("/self-scored" in r for r in rows)

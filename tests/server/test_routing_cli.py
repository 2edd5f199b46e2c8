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
    from kernels.devices import DEVICES
    from router.cost import Group, mixed_step_cost
    from router.step_time_file import StepSamples, write_step_samples
    from router.step_time_fit import StepSample
    from server.bootstrap import head_profiles

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


def test_fit_penalty_from_an_evaluation(tmp_path, capsys) -> None:
    table = {lang: {"32k": {"vocab_size": 32768, "bytes_per_token": bpt32,
                            "byte_fallback_share": 0.0, "bpb": 1.0 + 2.0 * (1 - bpt32 / 4.0)},
                    "262k": {"vocab_size": 262144, "bytes_per_token": 4.0,
                             "byte_fallback_share": 0.0, "bpb": 1.0}}
             for lang, bpt32 in (("en", 3.6), ("de", 2.8), ("ru", 1.0))}
    path = tmp_path / "eval-by-source.json"
    path.write_text(json.dumps(table))
    assert main(["heads", "fit-penalty", str(path)]) == 0
    out = capsys.readouterr().out
    assert "PenaltyFit(per_split=2, per_fallback_share=0) over 3 points" in out
    assert "ru" in out and "+150.0%" in out

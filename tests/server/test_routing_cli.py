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

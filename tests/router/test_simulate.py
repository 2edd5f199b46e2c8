from __future__ import annotations

from router.devices import DEVICES
from router.simulate.compare import best_static, compare, write_csv
from router.simulate.traces import TRACES, load_trace


def test_edge_trace_replays_through_every_policy(tmp_path) -> None:
    trace = TRACES["edge"](120)
    rows = compare(trace, "edge", DEVICES["a10g"])
    by = {r.policy: r.result for r in rows}
    assert set(by) == {"lifecycle", "cost", "threshold", "weighted",
                       "static:32k", "static:131k", "static:262k"}
    assert all(len(r.latencies) == len(trace) for r in by.values())  # nothing dropped
    best = best_static(rows).result.cost_s_per_mb
    assert by["lifecycle"].cost_s_per_mb <= best * 1.05
    assert by["static:32k"].switches == 0 and by["weighted"].switches > 0
    write_csv(rows, tmp_path / "out.csv")
    assert (tmp_path / "out.csv").read_text().startswith("trace,device,policy,cost_s_per_mb")


def test_trace_files(tmp_path) -> None:
    (tmp_path / "t.csv").write_text("arrival_s,prompt_bytes,output_bytes\n2,100,50\n1,10,5\n")
    trace = load_trace(tmp_path / "t.csv")
    assert [r.arrival_s for r in trace] == [1.0, 2.0] and trace[0].max_tokens == 512
    (tmp_path / "t.jsonl").write_text('{"arrival_s": 0, "prompt_bytes": 1, "output_bytes": 2,'
                                      ' "max_tokens": 8}\n')
    assert load_trace(tmp_path / "t.jsonl")[0].max_tokens == 8

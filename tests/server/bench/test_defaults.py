"""`polyhead bench defaults`'s arithmetic: ratios of mean bytes/s over rounds against the
pinned head a target names, MET / MISSED / NOT MEASURED, failed requests named, and the
exact label's texts compared with the pinned native head's round by round."""

from __future__ import annotations

from server.bench.defaults import EXACT, ROUTER, Run, exactness, mean_bytes, table, verdicts

NAMES = {"native": "pinned:262k", "second": "pinned:131k"}


def _run(label: str, prompts: str, c: int, i: int, b: float, failed: int = 0,
         texts: tuple[str, ...] = ()) -> Run:
    return Run(label, prompts, c, i, b, 8 - failed, failed, texts)


def test_verdicts_compare_round_means_against_the_named_pinned_head() -> None:
    runs = [_run(ROUTER, "mixed", 1, 1, 110.0), _run(ROUTER, "mixed", 1, 2, 90.0),
            _run("pinned:131k", "mixed", 1, 1, 95.0), _run("pinned:131k", "mixed", 1, 2, 105.0),
            _run(ROUTER, "mixed", 16, 1, 900.0), _run("pinned:131k", "mixed", 16, 1, 1000.0),
            _run(EXACT, "mixed", 1, 1, 130.0, failed=1), _run("pinned:262k", "mixed", 1, 1, 100.0)]
    assert mean_bytes(runs, ROUTER, "mixed", 1) == (100.0, 0.2)
    lines = verdicts(runs, NAMES)
    assert lines[0].startswith("MET router mixed c=1: bytes/s 1.00x pinned:131k")
    assert "round spread 20% / 10%" in lines[0]
    assert lines[1].startswith("MISSED router mixed c=16: bytes/s 0.90x")
    assert lines[2] == "NOT MEASURED router python c=1 against pinned:131k"
    assert lines[3].startswith("MISSED exact mixed c=1: bytes/s 1.30x pinned:262k")
    assert lines[3].endswith("1 requests failed")  # a failure never passes
    text = table(runs, [ROUTER, EXACT, "pinned:131k", "pinned:262k"], NAMES)
    assert "router" in text and "  1.00" in text  # the router against 131k at c=1


def test_exactness_counts_equal_texts_in_the_same_round() -> None:
    runs = [_run(EXACT, "mixed", 1, 1, 1.0, texts=("a", "b", "c")),
            _run("pinned:262k", "mixed", 1, 1, 1.0, texts=("a", "x", "c")),
            _run("pinned:262k", "mixed", 1, 2, 1.0, texts=("a", "b", "c"))]
    assert exactness(runs, "pinned:262k") == ["exact mixed c=1 round 1: 2 of 3 texts equal "
                                              "pinned:262k's"]

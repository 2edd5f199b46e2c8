"""Step-sample calibration files: round trip, validation, and seeding the calibrated timer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernels.devices import DEVICES
from router.cost import Group, mixed_step_cost
from router.errors import CalibrationFileError
from router.simulate.compare import compare
from router.simulate.traces import TRACES
from router.step_time_file import (
    StepSamples,
    read_step_samples,
    timer_from_file,
    write_step_samples,
)
from router.step_time_fit import StepSample
from tests.router.helpers import heads

DEV = DEVICES["a10g"]


def _data() -> StepSamples:
    profiles = heads()
    samples = []
    for h in profiles:
        for b in (1, 2, 4, 8, 16, 32, 64):
            g = [Group(h, b, 300.0)]
            # A device at half its roofline: every step twice the optimistic floor.
            samples.append(StepSample(((h.name, b, 300.0),),
                                      2 * mixed_step_cost(g, DEV).optimistic_s))
    return StepSamples(DEV, tuple(profiles), tuple(samples), {"model": "test", "threads": 2})


def test_round_trip(tmp_path: Path) -> None:
    data = _data()
    path = write_step_samples(tmp_path / "sub" / "steps.json", data)
    assert read_step_samples(path) == data
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp left


def test_seeded_timer_starts_from_the_samples(tmp_path: Path) -> None:
    data = _data()
    path = write_step_samples(tmp_path / "steps.json", data)
    timer = timer_from_file(path)
    assert timer.sample_count == len(data.samples) and timer.fit is not None
    measured = data.samples[3]
    h = next(p for p in data.heads if p.name == measured.groups[0][0])
    assert timer.step_time([Group(h, measured.groups[0][1], 300.0)]) == measured.seconds
    # An unmeasured shape comes from the fit, not from the analytic midpoint.
    g = [Group(data.heads[0], 48, 300.0)]
    assert timer.step_time(g) == pytest.approx(2 * mixed_step_cost(g, DEV).optimistic_s,
                                               rel=0.2)
    # Heads the router does not serve are ignored; another device only warns.
    other = timer_from_file(path, DEVICES["a100-80"], data.heads[:1])
    assert other.device.name == "a100-80" and other.sample_count == 7


def test_simulator_runs_on_a_seeded_timer(tmp_path: Path) -> None:
    path = write_step_samples(tmp_path / "steps.json", _data())
    data = read_step_samples(path)
    rows = compare(TRACES["edge"](60), "edge", data.device, data.heads,
                   policies=("cost",), timer=timer_from_file(path), kv=100_000, max_num_seqs=8)
    assert {r.policy for r in rows} == {"cost", "static:32k", "static:131k", "static:262k"}


@pytest.mark.parametrize("doc", [
    "not json", json.dumps({"format": "other"}),
    json.dumps({"format": "polyhead-step-samples", "version": 99}),
    json.dumps({"format": "polyhead-step-samples", "version": 1, "device": {}, "heads": [],
                "samples": []}),
])
def test_bad_files_raise_calibration_file_error(tmp_path: Path, doc: str) -> None:
    (tmp_path / "bad.json").write_text(doc)
    with pytest.raises(CalibrationFileError):
        read_step_samples(tmp_path / "bad.json")
    with pytest.raises(CalibrationFileError):
        read_step_samples(tmp_path / "missing.json")

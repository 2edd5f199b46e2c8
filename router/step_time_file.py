"""Step-sample calibration files: measured engine steps, written offline by
`polyhead bench engine --calibration-out FILE`, read by the gateway (settings
`calibration_file`) and by `polyhead simulate --calibration FILE`.

The file is self-describing JSON, so the simulator needs no checkpoint to use it:

    {"format": "polyhead-step-samples", "version": 1,
     "device": {DeviceSpec fields},            # where the steps were measured
     "heads": [{HeadProfile fields}, ...],     # the heads the samples name
     "meta": {...},                            # free-form: model, dtype, threads, tokens
     "samples": [{"groups": [[head, batch, mean context tokens], ...], "seconds": t}, ...]}

Each sample is one decode step (prefill steps are left out: the cost model describes decode).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kernels.crossover_calibration import CrossoverCalibration
from kernels.devices import DeviceSpec
from router.errors import CalibrationFileError
from router.profiles import HeadProfile
from router.step_time_fit import FittedStepTimer, StepSample

log = logging.getLogger(__name__)

FORMAT = "polyhead-step-samples"
VERSION = 1


@dataclass(frozen=True, slots=True)
class StepSamples:
    device: DeviceSpec
    heads: tuple[HeadProfile, ...]
    samples: tuple[StepSample, ...]
    meta: dict[str, Any] = field(default_factory=dict)


def write_step_samples(path: Path, data: StepSamples) -> Path:
    """Write atomically (temp file + rename): a reader never sees half a file."""
    doc = {"format": FORMAT, "version": VERSION, "device": asdict(data.device),
           "heads": [asdict(h) for h in data.heads], "meta": data.meta,
           "samples": [{"groups": [list(g) for g in s.groups], "seconds": s.seconds}
                       for s in data.samples]}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
    return path


def read_step_samples(path: Path) -> StepSamples:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CalibrationFileError(f"calibration file {path}: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CalibrationFileError(f"calibration file {path}: not a {FORMAT} file")
    if doc.get("version") != VERSION:
        raise CalibrationFileError(f"calibration file {path}: version {doc.get('version')} "
                                   f"is not {VERSION}")
    try:
        samples = tuple(
            StepSample(tuple((str(h), int(b), float(c)) for h, b, c in s["groups"]),
                       float(s["seconds"]))
            for s in doc["samples"])
        return StepSamples(DeviceSpec(**doc["device"]),
                           tuple(HeadProfile(**h) for h in doc["heads"]), samples,
                           dict(doc.get("meta") or {}))
    except (KeyError, TypeError, ValueError) as e:
        raise CalibrationFileError(f"calibration file {path}: malformed ({e!r})") from None


def seed_timer(timer: FittedStepTimer, samples: Iterable[StepSample]) -> int:
    """Record the samples into `timer`; returns how many named one of its heads."""
    before = timer.sample_count
    for s in samples:
        timer.record(s)
    return timer.sample_count - before


def timer_from_file(path: Path, device: DeviceSpec | None = None,
                    heads: Sequence[HeadProfile] | None = None,
                    kernel_calibration: CrossoverCalibration | None = None) -> FittedStepTimer:
    """A FittedStepTimer seeded from the file: on the file's device and heads unless given."""
    data = read_step_samples(path)
    device = device or data.device
    if device.name != data.device.name:
        log.warning("calibration file %s was measured on %s, the router runs as %s",
                    path, data.device.name, device.name)
    timer = FittedStepTimer(device, heads if heads is not None else data.heads,
                            kernel_calibration)
    used = seed_timer(timer, data.samples)
    fit = timer.fit
    log.info("calibration: %d of %d step samples from %s%s", used, len(data.samples), path,
             f"; fit rms error {fit.rms_rel_error:.1%}" if fit else "; too few to fit yet")
    return timer

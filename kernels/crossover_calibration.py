"""Kernel crossover calibration: measured b* per (device, V, d, dtype, mode), as JSON in the cache.

Pure Python. One file per device: $POLYHEAD_CACHE_DIR/calibration/<device>.json
(default ~/.cache/polyhead/calibration/). Written by `polyhead kernels calibrate`
(kernels/calibrate.py), read by the selector; it also carries the machine's measured roofline
(bandwidth, GEMM peak), which replaces the guessed one wherever a calibration is loaded.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
from bisect import bisect_left
from dataclasses import dataclass, field
from pathlib import Path

from kernels.cache_paths import calibration_dir
from kernels.devices import DeviceSpec
from kernels.errors import CalibrationError
from kernels.roofline import Efficiency

log = logging.getLogger(__name__)

VERSION = 1


def device_slug(device_name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", device_name).strip("-").lower() or "device"


def entry_key(vocab: int, d: int, dtype: str, mode: str) -> str:
    return f"V={vocab},d={d},dtype={dtype},mode={mode}"


def crossover_from_sweep(bs: list[int], t_stream: list[float], t_split: list[float]) -> float:
    """b* from a sweep: split must win at b* and at every larger b measured. Between the last
    streaming win and the first split win, take their geometric mean. inf: streaming always
    wins; 1: split always wins."""
    wins = [sp <= st for st, sp in zip(t_stream, t_split, strict=True)]
    i = len(wins)
    while i > 0 and wins[i - 1]:
        i -= 1
    if i == len(wins):
        return math.inf
    if i == 0:
        return float(bs[0])
    return math.sqrt(bs[i - 1] * bs[i])


@dataclass(slots=True)
class CrossoverCalibration:
    device: str
    entries: dict[str, dict] = field(default_factory=dict)
    efficiency: dict[str, float] = field(default_factory=dict)
    meta: dict[str, object] = field(default_factory=dict)

    def b_star(self, vocab: int, d: int, dtype: str, mode: str) -> float | None:
        entry = self.entries.get(entry_key(vocab, d, dtype, mode))
        if entry is None:
            return None
        b = entry.get("b_star")
        return math.inf if b is None else float(b)

    def measured_s(self, vocab: int, d: int, dtype: str, mode: str, b: float,
                   kernel: str) -> float | None:
        """Measured seconds of one group of b rows on `kernel` ("stream" or "split"), linear
        in b between the sweep's sizes; None outside the sweep or without an entry."""
        entry = self.entries.get(entry_key(vocab, d, dtype, mode))
        if entry is None or "b" not in entry:
            return None
        bs, ts = entry["b"], entry.get("t_split_s" if kernel == "split" else "t_stream_s")
        if not ts or len(ts) != len(bs) or not bs[0] <= b <= bs[-1]:
            return None
        i = bisect_left(bs, b)
        if bs[i] == b:
            return float(ts[i])
        f = (b - bs[i - 1]) / (bs[i] - bs[i - 1])
        return float(ts[i - 1] + f * (ts[i] - ts[i - 1]))

    def int8_rows(self) -> int | None:
        """Up to how many rows a product reads integer groups (kernels.precision), where
        `kernels calibrate` measured it."""
        entry = self.meta.get("int8")
        return int(entry["int8_rows"]) if isinstance(entry, dict) else None

    def roofline(self, spec: DeviceSpec) -> DeviceSpec:
        """`spec` with this machine's measured bandwidth and GEMM peak where the calibration
        measured them (kernels.machine), else `spec` as given."""
        measured = self.meta.get("roofline")
        if not isinstance(measured, dict):
            return spec
        return dataclasses.replace(spec, peak_flops=float(measured["peak_flops"]),
                                   mem_bw=float(measured["mem_bw"]))

    def fitted(self) -> Efficiency | None:
        e = self.efficiency
        if not e:
            return None
        base = Efficiency()
        return Efficiency(e.get("bw", base.bw), e.get("split_flops", base.split_flops),
                          e.get("stream_flops", base.stream_flops))

    def to_json(self) -> dict:
        return {"version": VERSION, "device": self.device, "meta": self.meta,
                "efficiency": self.efficiency, "entries": self.entries}


def path_for(device_name: str, directory: Path | None = None) -> Path:
    return (directory or calibration_dir()) / f"{device_slug(device_name)}.json"


def load_calibration(device_name: str, directory: Path | None = None
                     ) -> CrossoverCalibration | None:
    path = path_for(device_name, directory)
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CalibrationError(f"unreadable calibration {path}: {e}") from e
    if doc.get("version") != VERSION or doc.get("device") != device_name:
        log.warning("ignoring calibration %s: version or device mismatch", path)
        return None
    return CrossoverCalibration(doc["device"], doc.get("entries", {}), doc.get("efficiency", {}),
                       doc.get("meta", {}))


def save_calibration(cal: CrossoverCalibration, directory: Path | None = None) -> Path:
    path = path_for(cal.device, directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(cal.to_json(), indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
    return path

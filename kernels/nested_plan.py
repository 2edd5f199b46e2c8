"""The one rule for a step's nested heads: one pass over the largest head (kernels/nested.py)
or one pass per head group. Pure Python (no torch).

Groups whose heads are prefixes of the same rows can share one read of W[:Vmax]. The nested
pass does each group's FLOPs (Σ 2·b_g·V_g·d) and each group's sampler work, so it costs
what one group of the FLOP-equivalent size

    b_eff = ⌈Σ_g b_g·V_g ÷ Vmax⌉

costs on the largest head, against Σ_g t(b_g, V_g) for the per-group passes. Each time is the
faster of streaming and split as `kernels.crossover` picks it: measured by the device's
calibration when it swept those shapes (linear between swept b), else the roofline of
`kernels.roofline`, refitted with the calibration's efficiencies when it has any.

The engine (heads/engine/model_runner.py) and the router's cost model (router/cost.py) both
ask `plan_nested`, so what a mixed step costs is what the engine runs.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

from kernels.crossover import crossover_batch
from kernels.crossover_calibration import CrossoverCalibration
from kernels.devices import DeviceSpec
from kernels.roofline import path_times

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GroupShape:
    """One head group of a step: b rows sampling among the first V rows of the shared W."""

    batch: int
    vocab: int


@dataclass(frozen=True, slots=True)
class NestedPlan:
    nested: bool  # one pass over W[:Vmax] for all the groups
    b_eff: int  # the FLOP-equivalent group size on the largest head
    vocab: int  # Vmax
    nested_s: float  # estimated seconds of the one pass
    per_group_s: float  # estimated seconds of the per-group passes
    source: str  # "calibration" | "roofline"


def effective_batch(groups: Sequence[GroupShape]) -> int:
    vmax = max(g.vocab for g in groups)
    return max(1, math.ceil(sum(g.batch * g.vocab for g in groups) / vmax))


def group_time(b: int, vocab: int, d: int, dtype: str, mode: str, device: DeviceSpec,
               calibration: CrossoverCalibration | None = None,
               measured_only: bool = False) -> float | None:
    """Seconds of one group's unembedding on the kernel the crossover picks: measured when
    the calibration swept the shape, else (unless measured_only: None) the roofline's."""
    b_star, _ = crossover_batch(vocab, d, dtype, mode, device, calibration)
    split = b >= b_star
    own = calibration if calibration is not None and calibration.device == device.name else None
    if own is not None:
        t = own.measured_s(vocab, d, dtype, mode, b, "split" if split else "stream")
        if t is not None or measured_only:
            return t
    elif measured_only:
        return None
    times = path_times(b, vocab, d, dtype, mode, device, None if own is None else own.fitted())
    return times.split_s if split else times.stream_s


def plan_nested(
    groups: Sequence[GroupShape], d: int, dtype: str, mode: str, device: DeviceSpec,
    calibration: CrossoverCalibration | None = None,
) -> NestedPlan:
    """Whether the groups (heads nested in one matrix, at most one group per V) run as one
    pass. A single group is its own pass. `mode`: the step's sampling mode
    (kernels.dispatch.batch_mode over all its rows)."""
    if not groups:
        raise ValueError("a step needs at least one head group")
    if any(g.batch < 1 or g.vocab < 1 for g in groups):
        raise ValueError(f"group sizes and V must be >= 1: {groups}")
    vmax = max(g.vocab for g in groups)
    b_eff = effective_batch(groups)
    shapes = [(b_eff, vmax)] + [(g.batch, g.vocab) for g in groups]
    # Both sides from one source: a measured time against a roofline one would compare two
    # different models.
    measured = [group_time(b, v, d, dtype, mode, device, calibration, measured_only=True)
                for b, v in shapes]
    source = "calibration"
    times: list[float] = [t for t in measured if t is not None]
    if len(times) < len(shapes):
        source = "roofline"
        times = [group_time(b, v, d, dtype, mode, device, calibration) or 0.0
                 for b, v in shapes]
    nested_s, per_s = times[0], sum(times[1:])
    return NestedPlan(len(groups) > 1 and nested_s <= per_s, b_eff, vmax, nested_s, per_s,
                      source)

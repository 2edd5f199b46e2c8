"""Tables for `polyhead bench replay`: measured next to simulated, per policy and static head,
then the measured cost per regime, then the issue's targets checked on the measured runs."""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from router.simulate.engine import SimResult
from server.replay.runner import ReplayResult

REGIME_SLACK = 1.05  # "within 5% of the best static head for that regime"


@dataclass(frozen=True, slots=True)
class Compared:
    policy: str  # a policy name, or "static:<head>"
    real: ReplayResult
    sims: Mapping[str, SimResult]  # simulator label -> its prediction for the same trace


def _best(rows: Sequence[Compared], cost: dict[str, float]) -> float:
    return min(cost[r.policy] for r in rows if r.policy.startswith("static:"))


def table(rows: Sequence[Compared]) -> str:
    real = {r.policy: r.real.result.cost_s_per_mb for r in rows}
    best = _best(rows, real)
    labels = list(rows[0].sims)
    sims = {lab: {r.policy: r.sims[lab].cost_s_per_mb for r in rows} for lab in labels}
    head = (f"{'policy':14} {'real s/MB':>9} {'vs best':>7} {'p50 s':>7} {'p99 s':>7} "
            f"{'switch':>6} {'maxB':>4}" + "".join(f" {lab[:16]:>16} {'vs best':>7}"
                                                     for lab in labels) + "  share (real)")
    lines = [head]
    for r in rows:
        res = r.real.result
        share = " ".join(f"{h}={v:.2f}" for h, v in res.share().items())
        sim_cells = "".join(f" {sims[lab][r.policy]:16.4g} "
                            f"{sims[lab][r.policy] / _best(rows, sims[lab]):7.3f}"
                            for lab in labels)
        lines.append(f"{r.policy:14} {real[r.policy]:9.4g} {real[r.policy] / best:7.3f} "
                     f"{res.latency(0.5):7.3g} {res.latency(0.99):7.3g} {res.switches:6d} "
                     f"{res.max_batch:4d}{sim_cells}  {share}")
    return "\n".join(lines)


def regimes(rows: Sequence[Compared]) -> list[str]:
    return sorted({reg for r in rows for reg in r.real.regime_s})


def regime_table(rows: Sequence[Compared]) -> str:
    regs = regimes(rows)
    cost = {reg: {r.policy: r.real.regime_cost(reg) for r in rows} for reg in regs}
    lines = [f"{'policy':14}" + "".join(f" {reg + ' s/MB':>12} {'vs best':>7}" for reg in regs)]
    for r in rows:
        lines.append(f"{r.policy:14}" + "".join(
            f" {cost[reg][r.policy]:12.4g} {cost[reg][r.policy] / _best(rows, cost[reg]):7.3f}"
            for reg in regs))
    return "\n".join(lines)


def targets(rows: Sequence[Compared], policies: Sequence[str]) -> list[tuple[str, bool, str]]:
    """(target, met, detail) on the measured runs."""
    real = {r.policy: r.real.result.cost_s_per_mb for r in rows}
    best = _best(rows, real)
    ours = min(real[p] for p in policies)
    out = [("whole trace: best of " + "/".join(policies) + " <= best static head",
            ours <= best, f"{ours:.4g} vs {best:.4g} s/MB ({ours / best:.3f}x)")]
    for reg in regimes(rows):
        cost = {r.policy: r.real.regime_cost(reg) for r in rows}
        b = _best(rows, cost)
        for p in policies:
            out.append((f"regime {reg}: {p} within 5% of the best static head",
                        cost[p] <= REGIME_SLACK * b, f"{cost[p] / b:.3f}x"))
    return out


def write_csv(rows: Sequence[Compared], path: Path) -> None:
    regs = regimes(rows)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["source", "policy", "cost_s_per_mb", "p50_s", "p99_s", "switches",
                    "max_batch", "device_s", "output_bytes", "requests",
                    *(f"cost_{reg}" for reg in regs)])
        for r in rows:
            sources = [("real", r.real.result), *r.sims.items()]
            for source, res in sources:
                per_regime = [r.real.regime_cost(reg) if source == "real" else math.nan
                              for reg in regs]
                w.writerow([source, r.policy, res.cost_s_per_mb, res.latency(0.5),
                            res.latency(0.99), res.switches, res.max_batch, res.device_s,
                            res.output_bytes, sum(res.requests.values()), *per_regime])

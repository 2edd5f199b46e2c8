"""Run one trace through every policy and every static head on one device; tabulate."""

from __future__ import annotations

import csv
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kernels.devices import DeviceSpec
from router.cost import AnalyticTimer, StepTimer
from router.profiles import HeadProfile
from router.simulate.engine import SimEngine, SimResult, Texts
from router.simulate.traces import SimRequest

log = logging.getLogger(__name__)

# Device memory, bytes (datasheets); the CPU figure is a 64 GiB host.
DEVICE_MEMORY = {"a10g": 24e9, "a100-80": 80e9, "h100-sxm": 80e9, "h200": 141e9, "cpu": 64e9}
KV_FRACTION = 0.9  # of what the weights leave, as vLLM's gpu_memory_utilization

# The paper's 1.3B-class backbone (d=2048, 24 layers, full MHA KV) with three nested heads at
# Gemma-3's measured English bytes/token (see tests/router/test_lifecycle_table.py).
D, LAYERS, N = 2048, 24, 1_200_000_000
PAPER_HEADS = tuple(
    HeadProfile(name, v, D, N, 2 * LAYERS * D * 2, bytes_per_token=bpt, training_bytes=1e12)
    for name, v, bpt in (("32k", 32768, 3.9), ("131k", 131072, 4.4), ("262k", 262144, 4.6)))

POLICIES = ("lifecycle", "cost", "threshold", "weighted")


def kv_tokens(profiles: Sequence[HeadProfile], device: DeviceSpec) -> int:
    mem = DEVICE_MEMORY.get(device.name, 64e9)
    big = max(profiles, key=lambda p: p.vocab_size)
    weights = (big.backbone_params + 2 * big.unembed_params) * big.weight_bytes_per_param
    return int(max(0.0, mem - weights) * KV_FRACTION / big.kv_bytes_per_token)


def policy_doc(name: str, heads: Sequence[str]) -> dict:
    """A label's policy: a policy name, a head (pinned to it), `<policy>:blind` for the
    policy judging requests by the manifest's averages only (content-blind), or
    `<policy>:max_bpb_loss=0.5` for one numeric parameter set."""
    name, _, mode = name.partition(":")
    key, eq, value = mode.partition("=")
    params: dict = {} if not mode else {key: float(value)} if eq else {"features": mode}
    if name == "weighted":
        return {"name": "weighted", "params": {"weights": dict.fromkeys(heads, 1), **params}}
    if name in heads:
        return {"name": "pinned", "params": {"head": name}}
    return {"name": name, "params": params}


@dataclass(frozen=True, slots=True)
class Row:
    trace: str
    device: str
    policy: str  # a policy name, or "static:<head>"
    result: SimResult

    def cells(self) -> dict[str, object]:
        r = self.result
        share = r.share()
        return {"trace": self.trace, "device": self.device, "policy": self.policy,
                "cost_s_per_mb": round(r.cost_s_per_mb, 5),
                "p50_s": round(r.latency(0.5), 3), "p99_s": round(r.latency(0.99), 3),
                "switches": r.switches, "max_batch": r.max_batch,
                **{f"share_{h}": round(share[h], 3) for h in share}}


def compare(trace: Sequence[SimRequest], trace_name: str, device: DeviceSpec,
            profiles: Sequence[HeadProfile] = PAPER_HEADS, lam: float | None = 100.0,
            policies: Sequence[str] = POLICIES, timer: StepTimer | None = None,
            kv: int | None = None, max_num_seqs: int = 256,
            score_timer: StepTimer | None = None, texts: Texts | None = None) -> list[Row]:
    """`timer`: the step times the router decides with (default: the analytic model on
    `device`), e.g. a FittedStepTimer seeded from measured steps; `score_timer`: the step
    times charged (default: `timer`); `kv`: the KV budget in tokens (default: the device's
    memory); `texts`: per-language spelling per head (router.simulate.engine.Spelling)."""
    heads = [p.name for p in profiles]
    timer = timer or AnalyticTimer(device)
    kv = kv if kv is not None else kv_tokens(profiles, device)
    rows = []
    for name in (*policies, *heads):
        engine = SimEngine(profiles, timer, policy_doc(name, heads), kv, max_num_seqs,
                           lambda_forecast=lam, score_timer=score_timer, texts=texts)
        label = f"static:{name}" if name in heads else name
        rows.append(Row(trace_name, device.name, label, engine.run(trace, label)))
        log.info("%s on %s, %s: %.4g s/MB", trace_name, device.name, label,
                 rows[-1].result.cost_s_per_mb)
    return rows


def best_static(rows: Sequence[Row]) -> Row:
    return min((r for r in rows if r.policy.startswith("static:")),
               key=lambda r: r.result.cost_s_per_mb)


def write_csv(rows: Sequence[Row], path: Path) -> None:
    cells = [r.cells() for r in rows]
    fields = list(dict.fromkeys(k for c in cells for k in c))
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(cells)

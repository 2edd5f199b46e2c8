"""`polyhead bench replay --levels`: the same requests at several load levels, closed loop,
on one engine, every label interleaved per round; served quality scored once at the end
(a request served by the same head at two levels is scored once). A stock label (stock vLLM
on the native head) runs in the same rounds on its own backend."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from heads.model.weights import Checkpoint
from router.simulate.compare import policy_doc
from router.simulate.traces import SimRequest
from router.step_time_file import timer_from_file
from router.step_time_fit import FittedStepTimer
from server.backends.base import Backend
from server.bench.replay import breakdown, levels
from server.bench.replay.report import Compared
from server.bench.replay.runner import ReplayConfig, Replayer, ReplayResult
from server.bootstrap import device_spec, head_profiles

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Level:
    clients: int  # requests kept in flight (closed loop)
    rows: list[Compared]  # one per label, its median-cost round as `real`

    @property
    def name(self) -> str:
        """Named by the measured mean running batch of its runs."""
        mine = [r for r in self.rows if not levels.is_stock(r.policy)]  # steps not seen
        b = sum(r.real.mean_batch for r in mine) / max(1, len(mine))
        return f"B={b:.1f} ({self.clients} client{'s' if self.clients > 1 else ''})"


async def replay_levels(ckpt: Checkpoint, trace: Sequence[SimRequest], labels: Sequence[str],
                        clients: Sequence[int], cfg: ReplayConfig, rounds: int,
                        calibration: Path | None = None, score_stride: int = 1,
                        stock: Mapping[str, Backend] | None = None) -> list[Level]:
    """`labels`: policies, `static:<head>` and `stock-vllm:<head>` (served by `stock[head]`);
    each runs `rounds` times per level."""
    profiles = head_profiles(ckpt.manifest, ckpt.model.dtype_name,  # priced as the engine runs
                             probe_every=cfg.probe_every if cfg.measured_quality else None,
                             measure_positions=cfg.positions)
    device = device_spec("auto")
    heads = [p.name for p in profiles]

    def new_timer():  # as the gateway: calibrated live, seeded from the file if given
        if calibration is not None:
            return timer_from_file(calibration, device, profiles)
        return FittedStepTimer(device, profiles)

    replayer = Replayer(ckpt, profiles, cfg, new_timer)
    await replayer.warm_up()
    runs: dict[int, dict[str, list[ReplayResult]]] = {}
    try:
        for c in clients:
            for i in range(rounds):
                for label in labels:
                    on_stock = label.startswith(levels.STOCK_PREFIX)
                    name = label.removeprefix(levels.STOCK_PREFIX).removeprefix("static:")
                    if on_stock and name not in (stock or {}):
                        raise ValueError(f"{label} needs a stock backend on {name}")
                    res = await replayer.run(trace, policy_doc(name, heads), label,
                                             lambda t: "all", c,
                                             stock[name] if on_stock and stock else None)
                    runs.setdefault(c, {}).setdefault(label, []).append(res)
                    log.info("clients=%d %s (round %d/%d): %.4g s/MB busy, %.4g in flight, "
                             "mean B %.2f, %.0f s", c, label, i + 1, rounds,
                             res.result.cost_s_per_mb, levels.inflight_cost(res),
                             res.mean_batch, res.wall_s)
        every = [res for by in runs.values() for rs in by.values() for res in rs]
        pairs = {(s.index, h) for res in every for s in res.served
                 if s.index % score_stride == 0 for h in s.heads}
        log.info("scoring %d (request, head) continuations", len(pairs))
        replayer.score(trace, pairs)
        for res in every:
            res.bpb = [replayer.served_bpb(s) if s.index % score_stride == 0 else math.nan
                       for s in res.served]
    finally:
        await replayer.close()
    out = []
    for c, by in runs.items():
        rows = [Compared(label, sorted(rs, key=lambda r: levels.charged(label, r))[len(rs) // 2],
                         {}, tuple(rs)) for label, rs in by.items()]
        out.append(Level(c, rows))
    return out


def report(lvls: Sequence[Level], router: str, largest: str, english_only: bool,
           trace_name: str, out_dir: Path, english_ref: str | None = None
           ) -> tuple[str, list[tuple[str, bool, str]]]:
    """Each level's table, breakdown and targets as text; writes a PNG per level and one
    JSON. Returns (text, every target checked). `english_ref`: on the mixed trace, the
    static label the router's English prose BPB is held to."""
    out_dir.mkdir(parents=True, exist_ok=True)
    checks: list[tuple[str, bool, str]] = []
    dump: list[dict] = []
    lines: list[str] = []
    add = lines.append
    for lv in lvls:
        pts = levels.points(lv.rows)
        n = levels.noise(lv.rows)
        low, high = lv.clients == 1, lv.clients >= 16
        add(f"\n== {trace_name}, level {lv.name}: {len(lv.rows[0].real.served)} requests per "
              f"label, {n.rounds} round(s) ==")
        add(levels.table(pts, largest))
        add("\ndevice time by part (s, share of wall), per output MB (vs "
              f"{largest}: prefill/decode), decode step:")
        add(breakdown.table([r for r in lv.rows if not levels.is_stock(r.policy)], largest))
        mixed = english_ref if trace_name == "mixed" else None
        lv_checks = levels.targets(pts, router, largest, lv.name, n, english_only, low, high,
                                   mixed)
        for name, met, detail in lv_checks:
            add(f"  {'MET' if met else 'MISSED'} {name}: {detail}")
        checks += lv_checks
        png = out_dir / f"bench_replay_{trace_name}_c{lv.clients}.png"
        levels.plot(pts, f"{trace_name}, {lv.name}: cost vs served BPB", png)
        add(f"plot: {png}")
        dump.append({"level": lv.name, "clients": lv.clients, "noise": vars_of(n),
                     "points": [vars_of(p) for p in pts],
                     "breakdown": {r.policy: breakdown.parts(r.real) for r in lv.rows},
                     "targets": [{"target": t, "met": m, "detail": d}
                                 for t, m, d in lv_checks]})
    path = out_dir / f"bench_replay_{trace_name}_levels.json"
    path.write_text(json.dumps(dump, indent=2, default=float) + "\n")
    add(f"wrote {path}")
    return "\n".join(lines), checks


def vars_of(x: object) -> dict:
    return {f: getattr(x, f) for f in x.__slots__}  # type: ignore[attr-defined]

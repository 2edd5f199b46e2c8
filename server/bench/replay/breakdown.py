"""Where a replayed run's time went, per label: prefill steps, decode steps, prompt scoring
(inside the prefill steps), measuring (the measured quality control's prompt measurement and
decode probes, inside prefill and decode steps), host overhead (requests in flight but no
step running: routing, tokenizing, detokenizing, the event loop) and idle (nothing in
flight).

The cost a label is charged (device-s per output MB) is prefill + decode; each is shown per
output MB too, with the decode step's mean time and batch, so a head whose decode step is
cheaper but whose cost per byte is not can be traced to the part that does not shrink.
"""

from __future__ import annotations

from collections.abc import Sequence

from server.bench.replay.report import Compared
from server.bench.replay.runner import ReplayResult


def parts(res: ReplayResult) -> dict[str, float]:
    """Seconds per part; they sum to the run's wall time (up to timer rounding)."""
    busy = res.prefill_s + res.decode_s
    return {"prefill": res.prefill_s - res.score_s - res.measure_s, "scoring": res.score_s,
            "measuring": res.measure_s + res.probe_s, "decode": res.decode_s - res.probe_s,
            "overhead": max(0.0, res.inflight_s - busy),
            "idle": max(0.0, res.wall_s - res.inflight_s)}


def table(rows: Sequence[Compared], largest: str) -> str:
    """Seconds and shares of wall time per part, then per output MB against `largest`."""
    ref = next(r.real for r in rows if r.policy == largest)
    mb = lambda res: res.result.output_bytes / 1e6  # noqa: E731

    def per_mb(res: ReplayResult) -> tuple[float, float]:
        return (res.prefill_s / mb(res), res.decode_s / mb(res))

    names = list(parts(ref))
    lines = [f"{'policy':16} {'wall s':>7}" + "".join(f" {n + ' s':>11}" for n in names)
             + f" {'prefill s/MB':>12} {'decode s/MB':>11} {'(vs ' + largest + ')':>18}"
             f" {'decode ms/step':>14} {'mean B':>6}  decode ms/row per head"]
    rp, rd = per_mb(ref)
    for r in rows:
        res = r.real
        p = parts(res)
        share = {n: v / res.wall_s if res.wall_s else 0.0 for n, v in p.items()}
        fp, fd = per_mb(res)
        step = 1e3 * res.decode_s / res.decode_step_count if res.decode_step_count else 0.0
        rows_ms = " ".join(f"{h}={1e3 * s / n:.1f}" for h, (s, n) in
                           sorted(res.head_decode.items()) if n)
        lines.append(f"{r.policy:16} {res.wall_s:7.1f}" + "".join(
            f" {p[n]:6.1f}({share[n]:3.0%})" for n in names)
            + f" {fp:12.4g} {fd:11.4g} {fp / rp:8.3f}/{fd / rd:<9.3f} {step:14.1f}"
            f" {res.mean_batch:6.2f}  {rows_ms}")
    return "\n".join(lines)

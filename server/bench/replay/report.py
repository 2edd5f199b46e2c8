"""Tables for `polyhead bench replay`: measured next to simulated, per policy and static head;
the measured cost per regime; with languages, served quality and cost per language and the
output-compression predictor's error; then the targets, checked on the measured runs."""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from router.simulate.engine import SimResult
from server.bench.replay.runner import ReplayResult, Served

REGIME_SLACK = 1.05  # "within 5% of the best static head for that regime"
# Targets of a multilingual trace (request-aware routing against its baselines, one run).
COST_VS_STATIC = 0.85  # request-aware cost <= this × the best static head's
COST_VS_BLIND = 0.85  # request-aware cost <= this × content-blind routing's
BPB_VS_LARGEST = 1.05  # non-English served BPB <= this × always-largest-head's
ENGLISH_VS_STATIC = 1.03  # on an English-only trace: cost <= this × the best static head's


@dataclass(frozen=True, slots=True)
class Compared:
    policy: str  # a policy name, or "static:<head>"
    real: ReplayResult
    sims: Mapping[str, SimResult]  # simulator label -> its prediction for the same trace
    runs: tuple[ReplayResult, ...] = ()  # every round's run, `real` among them


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


def _mean(xs: Sequence[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return sum(xs) / len(xs) if xs else math.nan


def served_bpb(res: ReplayResult, english: bool | None = None, lang: str | None = None) -> float:
    """Mean BPB of the served requests' continuations (English only, non-English only, or
    one language)."""
    return _mean([b for s, b in zip(res.served, res.bpb, strict=True)
                  if (english is None or (s.lang == "en") == english)
                  and (lang is None or s.lang == lang)])


def lang_cost(res: ReplayResult, lang: str) -> float:
    """Device-s per MB of one language's output: each request's tokens at its head's busy
    seconds per token in this run (steps are shared, so time is split by token share)."""
    mine = [s for s in res.served if s.lang == lang]
    mb = sum(s.text_bytes for s in mine) / 1e6
    return sum(s.tokens * res.head_cost_per_token(s.head) for s in mine) / mb if mb else math.nan


def languages(rows: Sequence[Compared]) -> list[str]:
    seen = {s.lang for r in rows for s in r.real.served}
    return sorted(seen, key=lambda x: (x != "en", x))


def quality_table(rows: Sequence[Compared]) -> str:
    """Served BPB (English, non-English) and share per label."""
    lines = [f"{'policy':16} {'s/MB':>9} {'p50 s':>7} {'p99 s':>7} {'BPB en':>7} "
             f"{'BPB non-en':>10}  share"]
    for r in rows:
        res = r.real
        share = " ".join(f"{h}={v:.2f}" for h, v in res.result.share().items())
        lines.append(f"{r.policy:16} {res.result.cost_s_per_mb:9.4g} "
                     f"{res.result.latency(0.5):7.3g} {res.result.latency(0.99):7.3g} "
                     f"{served_bpb(res, True):7.3f} {served_bpb(res, False):10.3f}  {share}")
    return "\n".join(lines)


def language_table(rows: Sequence[Compared]) -> str:
    """Per language: each label's cost (s/MB) and served BPB, and where it went."""
    langs = languages(rows)
    lines = [f"{'lang':6}" + "".join(f" {r.policy[:16]:>16}" for r in rows) + "   (s/MB / BPB)"]
    for lang in langs:
        cells = "".join(f" {lang_cost(r.real, lang):8.3g}/{served_bpb(r.real, lang=lang):<7.3f}"
                        for r in rows)
        lines.append(f"{lang:6}{cells}")
    heads = sorted({s.head for r in rows for s in r.real.served})
    for r in rows:
        if r.policy.startswith("static:"):
            continue
        for lang in langs:
            n = {h: sum(1 for s in r.real.served if s.lang == lang and s.head == h)
                 for h in heads}
            lines.append(f"  {r.policy} {lang}: " + " ".join(f"{h}={c}" for h, c in n.items()))
    return "\n".join(lines)


def predictor_error(res: ReplayResult) -> dict[str, float]:
    """Mean absolute relative error of output bytes/token predictions on the serving head:
    the router's (prompt shrunk toward live per-script figures), the prompt's own figure
    alone, and the manifest's average."""
    rows = [s for s in res.served if s.tokens and s.predicted_bpt is not None]
    if not rows:
        return {}

    def mare(pred: Callable[[Served], float | None]) -> float:
        errs = [abs(p - s.text_bytes / s.tokens) / (s.text_bytes / s.tokens)
                for s in rows if (p := pred(s)) is not None]
        return sum(errs) / len(errs) if errs else math.nan

    return {"requests": float(len(rows)), "router": mare(lambda s: s.predicted_bpt),
            "prompt only": mare(lambda s: s.prompt_bpt)}


def language_targets(rows: Sequence[Compared], aware: str, blind: str, largest: str,
                     english_only: bool) -> list[tuple[str, bool, str]]:
    """`largest`: the label of the always-largest-head run, e.g. "static:262k"."""
    real = {r.policy: r.real for r in rows}
    cost = {p: res.result.cost_s_per_mb for p, res in real.items()}
    statics = [p for p in cost if p.startswith("static:")]
    best = min(statics, key=cost.__getitem__)
    if english_only:
        ratio = cost[aware] / cost[best]
        return [(f"English-only: {aware} <= {ENGLISH_VS_STATIC:g}x the best static head "
                 f"({best})", ratio <= ENGLISH_VS_STATIC, f"{ratio:.3f}x")]
    out = []
    ratio = cost[aware] / cost[best]
    out.append((f"{aware} <= {COST_VS_STATIC:g}x the best static head's cost ({best})",
                ratio <= COST_VS_STATIC, f"{cost[aware]:.4g} vs {cost[best]:.4g} s/MB "
                                         f"({ratio:.3f}x)"))
    if blind in cost:
        ratio = cost[aware] / cost[blind]
        out.append((f"{aware} <= {COST_VS_BLIND:g}x content-blind {blind}'s cost",
                    ratio <= COST_VS_BLIND, f"{cost[aware]:.4g} vs {cost[blind]:.4g} s/MB "
                                            f"({ratio:.3f}x)"))
    mine, ref = served_bpb(real[aware], False), served_bpb(real[largest], False)
    out.append((f"non-English served BPB of {aware} within {BPB_VS_LARGEST - 1:.0%} of "
                f"{largest}'s", mine <= BPB_VS_LARGEST * ref,
                f"{mine:.3f} vs {ref:.3f} ({mine / ref:.3f}x)"))
    return out

"""polyhead plan: lifecycle cost per candidate vocabulary for a deployment forecast; print a
table, write JSON and a PNG of cost against λ (one line per V)."""

from __future__ import annotations

import argparse
import json
import logging
import math
from pathlib import Path
from typing import Any

from router.planner import ScopePlan, VocabPlan, parse_forecast, plan
from router.planner.plan import plan_json
from server.commands.errors import CliError

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="pick a vocabulary size for a deployment forecast")
    p.add_argument("forecast", type=Path, help="forecast YAML (see deploy/forecasts/)")
    p.add_argument("--out", type=Path, default=Path("plan-out"))
    p.add_argument("--no-plot", action="store_true")
    p.set_defaults(run=run)


def load_yaml(path: Path) -> Any:
    import yaml  # lazily: only this command reads YAML

    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise CliError(f"{path}: not valid YAML: {str(e).splitlines()[0]}") from None


def _k(v: int) -> str:
    return f"{v // 1024}k" if v % 1024 == 0 else str(v)


def _lam(x: float) -> str:
    return "never" if math.isinf(x) else f"{x:.3g}"


def print_scope(s: ScopePlan, bpt: dict[int, tuple[float, str]]) -> None:
    title = "mix" if s.name == "mix" else f"regime {s.name} (share {s.share:g}, alone)"
    print(f"\n{title}: optimal V = {_k(s.optimal.vocab_size)} at λ = {s.lam:g}; "
          f"training optimum {_k(s.train_optimal.vocab_size)}")
    print(f"  {'V':>6} {'B/tok':>6} {'src':8} {'C_train':>10} {'C_infer':>10} "
          f"{'C_life(λ)':>10} {'vs opt':>7} {'break-even λ':>13}")
    best, evens = s.optimal.at(s.lam), s.break_evens()
    for ln in s.lines:
        b, src = bpt[ln.vocab_size]
        mark = " *" if ln is s.optimal else ""
        even = "(train opt)" if ln is s.train_optimal else _lam(evens[ln.vocab_size])
        print(f"  {_k(ln.vocab_size):>6} {b:6.2f} {src:8} {ln.train:10.4g} {ln.infer:10.4g} "
              f"{ln.at(s.lam):10.4g} {ln.at(s.lam) / best:7.3f} {even:>13}{mark}")
    env = ", ".join(f"{_k(v)} for λ in [{a:.3g}, {_lam(b)})" for a, b, v in s.envelope())
    print(f"  optimal by λ: {env}")


def print_plan(p: VocabPlan) -> None:
    f = p.forecast
    bb = f.backbone
    print(f"forecast {f.name}: device {f.device.name}, λ = {f.lam:g}, d = {bb.hidden_size}, "
          f"N = {bb.backbone_params:.3g}, KV = {bb.kv_bytes_per_token:.0f} B/token, "
          f"mfu = {f.mfu:g}  (costs in device-s per byte)")
    bpt = {c.vocab_size: (c.bytes_per_token, c.source) for c in f.candidates}
    for s in p.scopes:
        print_scope(s, bpt)
    if f.sweep:
        print(f"\noptimal V by λ: {'scope':>12} " + " ".join(f"{lam:>7g}" for lam in f.sweep))
        for s in p.scopes:
            print(f"{'':16}{s.name:>12} " + " ".join(
                f"{_k(s.optimal_at(lam).vocab_size):>7}" for lam in f.sweep))


def _lam_range(p: VocabPlan) -> tuple[float, float]:
    finite = [x for s in p.scopes for x in s.break_evens().values() if 0 < x < math.inf]
    points = [x for x in (*finite, p.forecast.lam, *p.forecast.sweep) if x > 0]
    return min([0.01, *points]) / 3, max([100.0, *points]) * 3


def plot(p: VocabPlan, path: Path) -> None:
    import matplotlib  # lazily: only the CLI draws

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lo, hi = _lam_range(p)
    lams = [lo * (hi / lo) ** (i / 199) for i in range(200)]
    scopes = p.scopes
    fig, axes = plt.subplots(1, len(scopes), figsize=(5 * len(scopes), 4), squeeze=False)
    for ax, s in zip(axes[0], scopes, strict=True):
        for ln in s.lines:
            ax.plot(lams, [ln.at(lam) for lam in lams], label=f"V={_k(ln.vocab_size)}")
        ax.axvline(s.lam, color="black", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"{p.forecast.name}: {s.name}" + ("" if s.name == "mix" else " alone"))
        ax.set_xlabel("λ (served ÷ training bytes)")
        ax.set_ylabel("C_lifecycle, device-s per training byte")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(args: argparse.Namespace) -> None:
    result = plan(parse_forecast(load_yaml(args.forecast)))
    print_plan(result)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.forecast.stem
    out_json = args.out / f"plan-{stem}.json"
    out_json.write_text(json.dumps(plan_json(result), indent=2) + "\n")
    print(f"\nwrote {out_json}")
    if not args.no_plot:
        png = args.out / f"plan-{stem}.png"
        plot(result, png)
        print(f"wrote {png}")

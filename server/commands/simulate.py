"""polyhead simulate: replay a trace through the real router, for every policy and every
static head, on one or more device profiles; print a table, write CSV and PNG.

The router decides with the analytic cost model. Scoring it with that same model would
make "lifecycle <= best static head" true by construction, so with `--calibration` every
run is charged twice: by the analytic model (self-scored, for comparison) and by the step
times measured on the real engine (the honest figure). Traces with languages
(multilingual, english) are tokenized per head as each head of `--model` spells the
committed sample of that language.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path

from kernels.devices import lookup_device
from router.cost import AnalyticTimer
from router.simulate.compare import POLICIES, Row, best_static, compare, write_csv
from router.simulate.engine import Texts
from router.simulate.traces import TEXT_TRACES, TRACES, SimRequest, load_trace
from router.step_time_file import read_step_samples, timer_from_file

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="replay an arrival trace through the router")
    p.add_argument("--trace", default="diurnal",
                   help=f"a CSV/JSONL file, or one of: {', '.join(TRACES)}")
    p.add_argument("--device", default="a100-80",
                   help="device profile(s), comma-separated: a10g, a100-80, h100-sxm, h200, cpu")
    p.add_argument("--duration", type=float, default=None, help="synthetic trace length, s")
    p.add_argument("--lambda", dest="lam", type=float, default=100.0,
                   help="forecast λ the lifecycle policy uses (served ÷ training bytes)")
    p.add_argument("--calibration", type=Path, default=None, metavar="FILE",
                   help="step samples from `polyhead bench engine --calibration-out`: simulate "
                        "that model's heads on the measured device, with calibrated step times "
                        "(--device is then ignored)")
    p.add_argument("--model", default="gemma3-270m",
                   help="whose heads spell the languages of a multilingual trace (built-in "
                        "name or checkpoint directory)")
    p.add_argument("--policies", default=None,
                   help="comma-separated; default lifecycle,cost,threshold,weighted (with "
                        "languages: lifecycle,lifecycle:blind)")
    p.add_argument("--out", type=Path, default=Path("simulate-out"))
    p.add_argument("--no-plot", action="store_true")
    p.set_defaults(run=run)


def _trace(arg: str, duration: float | None) -> tuple[str, list[SimRequest]]:
    if arg in TRACES:
        return arg, TRACES[arg](duration) if duration else TRACES[arg]()
    return Path(arg).stem, load_trace(Path(arg))


def print_table(rows: Sequence[Row]) -> None:
    best = best_static(rows).result.cost_s_per_mb
    print(f"{'trace':10} {'device':9} {'policy':14} {'s/MB':>9} {'vs best':>8} "
          f"{'p50 s':>8} {'p99 s':>8} {'switch':>6}  share")
    for r in rows:
        c = r.cells()
        share = " ".join(f"{k[6:]}={v:.2f}" for k, v in c.items() if k.startswith("share_"))
        print(f"{r.trace:10} {r.device:9} {r.policy:14} {c['cost_s_per_mb']:9.4g} "
              f"{r.result.cost_s_per_mb / best:8.3f} {c['p50_s']:8.3g} {c['p99_s']:8.3g} "
              f"{c['switches']:6d}  {share}")


def plot(rows: Sequence[Row], path: Path) -> None:
    import matplotlib  # lazily: only the CLI draws

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    devices = list(dict.fromkeys(r.device for r in rows))
    fig, axes = plt.subplots(1, len(devices), figsize=(5 * len(devices), 4), squeeze=False)
    for ax, dev in zip(axes[0], devices, strict=True):
        sub = [r for r in rows if r.device == dev]
        best = best_static(sub).result.cost_s_per_mb
        ax.bar([r.policy for r in sub], [r.result.cost_s_per_mb / best for r in sub],
               color=["tab:blue" if not r.policy.startswith("static") else "tab:gray"
                      for r in sub])
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_title(f"{sub[0].trace} on {dev}")
        ax.set_ylabel("device-s per MB ÷ best static head")
        ax.tick_params(axis="x", rotation=45)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _texts(model: str) -> Texts:
    from heads.checkpoint import load_metadata
    from heads.corpus.languages import languages
    from heads.vocab.prompt_encoder import PromptEncoder
    from server.bench.replay.prompts import spellings
    from server.model_source import resolve_model_dir
    from server.settings import load_settings

    manifest, toks = load_metadata(resolve_model_dir(model, load_settings(None).cache_dir))
    encoder = PromptEncoder(toks, {h.name: h.bos_token_id for h in manifest.heads})
    try:
        return spellings(encoder, languages())
    finally:
        encoder.close()


def run(args: argparse.Namespace) -> None:
    name, trace = _trace(args.trace, args.duration)
    langs = args.trace in TEXT_TRACES or any(r.lang != "en" for r in trace)
    texts = _texts(args.model) if langs else None
    default = "lifecycle,lifecycle:blind" if langs else ",".join(POLICIES)
    policies = [p.strip() for p in (args.policies or default).split(",") if p.strip()]
    rows: list[Row] = []
    if args.calibration is not None:
        data = read_step_samples(args.calibration)
        analytic = AnalyticTimer(data.device)
        measured = timer_from_file(args.calibration)
        for label, score in (("self-scored", analytic), ("measured", measured)):
            print(f"\nrouted by the analytic model, charged by {label} step times:")
            scored = compare(trace, name, data.device, data.heads, lam=args.lam,
                             policies=policies, timer=analytic, score_timer=score,
                             texts=texts)
            scored = [dataclasses.replace(r, device=f"{r.device}/{label}") for r in scored]
            print_table(scored)
            rows.extend(scored)
    for dev in args.device.split(",") if args.calibration is None else ():
        device_rows = compare(trace, name, lookup_device(dev.strip()), lam=args.lam,
                              policies=policies, texts=texts)
        print_table(device_rows)
        rows.extend(device_rows)
    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = args.out / f"simulate-{name}.csv"
    write_csv(rows, csv_path)
    print(f"wrote {csv_path}")
    if not args.no_plot:
        png = args.out / f"simulate-{name}.png"
        plot(rows, png)
        print(f"wrote {png}")

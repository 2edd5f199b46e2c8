"""The report of `polyhead heads eval`: eval.json, eval-by-source.json, the manifest's figures,
and the PNGs (per head across V, and per source). Measurement (heads/eval/measure.py) never
imports this."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

from heads.eval.measure import AGGREGATE, HeadSourceResult, aggregate, by_source, evaluate
from heads.manifest import MANIFEST_FILE
from heads.model.weights import Checkpoint, load_checkpoint


def plot(results: list[HeadSourceResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    all_rows = [*results, *aggregate(results)]
    for source in dict.fromkeys(r.source for r in all_rows):
        rs = sorted((r for r in all_rows if r.source == source), key=lambda r: r.vocab_size)
        style = {"linewidth": 2.5, "color": "black"} if source == AGGREGATE else {}
        vs = [r.vocab_size for r in rs]
        axes[0].plot(vs, [r.bytes_per_token for r in rs], marker="o", label=source, **style)
        axes[1].plot(vs, [r.bpb for r in rs], marker="o", label=source, **style)
    for ax, ylabel in zip(axes, ("bytes / token", "bits / byte"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("head vocabulary size V")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.suptitle("per-head compression and BPB on held-out text")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_by_source(results: list[HeadSourceResult], path: Path) -> None:
    """Grouped bars: per source (language), BPB and bytes/token of each head."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sources = list(dict.fromkeys(r.source for r in results))
    heads = sorted({(r.vocab_size, r.head) for r in results})
    width = 0.8 / len(heads)
    fig, axes = plt.subplots(2, 1, figsize=(max(7.0, 0.75 * len(sources) + 2), 7), sharex=True)
    cell = {(r.source, r.head): r for r in results}
    for k, (_, head) in enumerate(heads):
        xs = [i + (k - (len(heads) - 1) / 2) * width for i in range(len(sources))]
        rs = [cell[(s, head)] for s in sources]
        axes[0].bar(xs, [r.bpb for r in rs], width, label=head)
        axes[1].bar(xs, [r.bytes_per_token for r in rs], width, label=head)
    axes[0].set_ylabel("bits / byte")
    axes[1].set_ylabel("bytes / token")
    axes[1].set_xticks(range(len(sources)), sources)
    for ax in axes:
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8, title="head")
    fig.suptitle("per-head BPB and compression by source")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_results(ckpt: Checkpoint, results: list[HeadSourceResult], out: Path,
                  update_manifest: bool = True) -> Path:
    """Write eval.json (rows), eval-by-source.json (source -> head -> figures), eval.png and
    eval-by-source.png; with `update_manifest`, also record the aggregate in the manifest
    (atomically)."""
    totals = {r.head: r for r in aggregate(results)}
    if update_manifest:
        heads = tuple(replace(h, bytes_per_token=round(totals[h.name].bytes_per_token, 4),
                              bpb=round(totals[h.name].bpb, 4)) for h in ckpt.manifest.heads)
        sources = sorted({r.source for r in results})
        manifest = replace(ckpt.manifest, heads=heads,
                           extra={**ckpt.manifest.extra, "eval_sources": sources})
        manifest.validate()
        tmp = ckpt.directory / f".{MANIFEST_FILE}.tmp"
        tmp.write_text(manifest.to_json())
        os.replace(tmp, ckpt.directory / MANIFEST_FILE)
    out.mkdir(parents=True, exist_ok=True)
    rows = [r.row() for r in [*results, *totals.values()]]
    (out / "eval.json").write_text(json.dumps(rows, indent=2) + "\n")
    (out / "eval-by-source.json").write_text(json.dumps(by_source(results), indent=2) + "\n")
    png = out / "eval.png"
    plot(results, png)
    plot_by_source(results, out / "eval-by-source.png")
    return png


def run_eval(model_dir: Path, files: list[Path], max_bytes: int, window: int,
             out: Path | None = None, compute_dtype: str | None = None,
             window_bytes: int | None = None, update_manifest: bool = True,
             only: list[str] | None = None, grouped: bool = False,
             round_logits: bool = False) -> tuple[list[HeadSourceResult], Path]:
    """`compute_dtype` (e.g. "float32") runs the weights in that dtype; `round_logits` rounds
    the logits to it as the CPU engine serves them (heads.eval.measure.token_bits).
    `update_manifest` records the aggregate figures in the checkpoint's manifest (the demo
    build does; `polyhead heads eval` only with --update)."""
    ckpt = load_checkpoint(model_dir, compute_dtype=compute_dtype)
    if only is not None and update_manifest:
        raise ValueError("updating the manifest needs every head evaluated")
    results = evaluate(ckpt, files, max_bytes, window, window_bytes, only, grouped,
                       round_logits)
    png = write_results(ckpt, results, out or model_dir / "eval", update_manifest)
    return results, png

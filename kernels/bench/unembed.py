"""Unembedding benchmark: reference vs split vs streaming vs the selector's plan, per (b, V).

Reports time, effective GB/s (W bytes / t) and TFLOP/s (2·b·V·d / t), the share of the
roofline bound max(W/BW, FLOPs/peak) reached, and speedups over the reference measured in the
same run. Never asserts speed.
"""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch

from kernels import chunked, reference, split
from kernels.crossover_calibration import load_calibration
from kernels.devices import DeviceSpec
from kernels.dispatch import batch_mode, dtype_name, run_plan
from kernels.roofline import DTYPE_BYTES, roofline_bound_s
from kernels.sampling_params import SampleOutput, SamplingBatch
from kernels.selector import choose, stream_kernel
from kernels.timing import hidden_states, median_time, mode_batch, weight_copies

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Row:
    b: int
    vocab: int
    d: int
    dtype: str
    mode: str
    path: str  # reference | split | chunked | fused | plan:<kernel>
    seconds: float
    gb_s: float
    tflop_s: float
    pct_roofline: float
    speedup_vs_reference: float


def _paths(device: DeviceSpec) -> dict[str, Callable[..., SampleOutput]]:
    paths: dict[str, Callable[..., SampleOutput]] = {"reference": reference.unembed_and_sample,
                                "split": split.unembed_and_sample}
    if device.is_cpu:
        paths["chunked"] = chunked.unembed_and_sample
    else:
        from kernels import triton_fused  # GPU only

        paths["fused"] = triton_fused.unembed_and_sample
    return paths


def _call(fn: Callable[..., SampleOutput], hidden: torch.Tensor, batch: SamplingBatch,
          weight: torch.Tensor) -> SampleOutput:
    return fn(hidden, weight, batch)


def run_bench(
    bs: list[int], vocabs: list[int], d: int, dtype: torch.dtype, mode: str,
    device: DeviceSpec, torch_device: torch.device, repeats: int,
    skip_reference_above: int | None = None,
) -> list[Row]:
    rows: list[Row] = []
    cal = load_calibration(device.name)
    dt = dtype_name(dtype)
    for vocab in vocabs:
        weights = weight_copies(vocab, d, dtype, torch_device)
        for b in bs:
            hidden = hidden_states(b, d, dtype, torch_device)
            batch = mode_batch(mode, b)
            plan = choose(b, vocab, d, dt, batch_mode(batch, vocab), device, cal)
            times: dict[str, float] = {}
            for name, fn in _paths(device).items():
                if name == "reference" and skip_reference_above and b > skip_reference_above:
                    continue
                times[name] = median_time(partial(_call, fn, hidden, batch), weights, repeats)
            picked = stream_kernel(device) if plan.kernel != "split" else "split"
            times[f"plan:{plan.kernel}"] = times.get(picked) or median_time(
                partial(_call, partial(run_plan, plan), hidden, batch), weights, repeats)
            ref = times.get("reference", float("nan"))
            bound = roofline_bound_s(b, vocab, d, dt, device)
            for name, t in times.items():
                rows.append(Row(
                    b, vocab, d, dt, mode, name, t,
                    vocab * d * DTYPE_BYTES[dt] / t / 1e9, 2 * b * vocab * d / t / 1e12,
                    100 * bound / t, ref / t,
                ))
            log.info("b=%d V=%d: %s", b, vocab, {k: f"{v * 1e3:.2f} ms" for k, v in times.items()})
    return rows


def format_table(rows: list[Row]) -> str:
    head = (f"{'V':>7} {'b':>4} {'path':<14}{'ms':>10}{'GB/s':>9}{'TFLOP/s':>9}"
            f"{'%roof':>7}{'x ref':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.vocab:>7} {r.b:>4} {r.path:<14}{r.seconds * 1e3:>10.2f}{r.gb_s:>9.1f}"
                     f"{r.tflop_s:>9.3f}{r.pct_roofline:>7.1f}{r.speedup_vs_reference:>7.2f}")
    return "\n".join(lines)


def write_outputs(rows: list[Row], device: DeviceSpec, out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "bench_kernels.json", "csv": out / "bench_kernels.csv",
             "png": out / "bench_kernels.png"}
    doc = {"device": asdict(device), "rows": [asdict(r) for r in rows]}
    paths["json"].write_text(json.dumps(doc, indent=2) + "\n")
    with paths["csv"].open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(asdict(rows[0])))
        w.writeheader()
        w.writerows(asdict(r) for r in rows)
    plot(rows, device, paths["png"])
    return paths


def plot(rows: list[Row], device: DeviceSpec, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    vocabs = sorted({r.vocab for r in rows})
    fig, axes = plt.subplots(1, len(vocabs), figsize=(5 * len(vocabs), 4), squeeze=False)
    for ax, vocab in zip(axes[0], vocabs, strict=True):
        for path_name in sorted({r.path for r in rows if not r.path.startswith("plan:")}):
            pts = sorted((r.b, r.seconds * 1e3) for r in rows
                         if r.vocab == vocab and r.path == path_name)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=path_name)
        sel = sorted((r.b, r.seconds * 1e3) for r in rows
                     if r.vocab == vocab and r.path.startswith("plan:"))
        ax.plot([p[0] for p in sel], [p[1] for p in sel], "k--", lw=1, label="selected plan")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("head group size b")
        ax.set_ylabel("ms per step")
        ax.set_title(f"V={vocab}, d={rows[0].d}, {rows[0].dtype}, {rows[0].mode}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"unembedding + sampling on {device.name}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

"""Mixed-head step benchmark: one step's unembedding + sampling for a mix of nested heads, per
group (before) and in one nested pass (after), against the largest head alone at the same
total B, as the CPU engine runs them (packed oneDNN rows where the device has them).

Reports ms, effective GB/s (the W bytes each path must read ÷ t: Σ V_g·d·s per group,
Vmax·d·s for the nested pass and the largest head alone), and the ratio to the largest head
alone measured in the same run. The baseline is the faster of the two kernels (streaming,
split) for the largest head alone, not only the one the selector picks: an uncalibrated
selector that picks a slow kernel for the baseline would flatter the ratio. The target: a
mixed step costs at most TARGET× that baseline at the same B. Never asserts speed.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from kernels import nested
from kernels.crossover_calibration import load_calibration
from kernels.devices import DeviceSpec
from kernels.dispatch import batch_mode, dtype_name, run_plan
from kernels.nested_plan import GroupShape, effective_batch, plan_nested
from kernels.packed_rows import PackedRows, RowPacker, packing_supported
from kernels.roofline import DTYPE_BYTES
from kernels.sampling_params import SamplingBatch
from kernels.selector import KernelChoice, choose, stream_kernel
from kernels.timing import hidden_states, mode_batch

log = logging.getLogger(__name__)

TARGET = 1.10  # mixed step ÷ largest head alone, same B
DEFAULT_MIXES: list[dict[int, int]] = [
    {262144: 1, 131072: 1}, {262144: 2, 131072: 2}, {262144: 2, 32768: 2},
    {262144: 4, 32768: 4}, {262144: 1, 131072: 8, 32768: 8}, {262144: 8, 131072: 8},
    {262144: 4, 131072: 4, 32768: 8}, {131072: 4, 32768: 12}, {262144: 1, 32768: 15},
]


@dataclass(frozen=True, slots=True)
class MixRow:
    mix: str  # "262144x1+131072x1"
    b: int  # total rows
    d: int
    dtype: str
    mode: str
    alone_ms: float  # the largest head alone, b rows: the faster of streaming and split
    alone_plan_ms: float  # the same on the kernel the selector picks
    before_ms: float  # one pass per head group
    after_ms: float  # one nested pass
    alone_gb_s: float
    before_gb_s: float
    after_gb_s: float
    alone_kernel: str  # the faster kernel alone
    before_ratio: float  # before ÷ alone
    after_ratio: float  # after ÷ alone
    nested_kernel: str  # the selector's kernel for the nested pass
    plan_picks: str  # "nested" | "per-group": what kernels.nested_plan chooses for the engine
    target_met: bool  # after_ratio <= TARGET


def mix_name(mix: dict[int, int]) -> str:
    return "+".join(f"{v}x{b}" for v, b in sorted(mix.items(), reverse=True))


def parse_mix(text: str) -> dict[int, int]:
    """"262144x1+131072x8" -> {262144: 1, 131072: 8}."""
    out: dict[int, int] = {}
    for part in text.split("+"):
        v, _, b = part.partition("x")
        out[int(v)] = out.get(int(v), 0) + int(b)
    return out


class _Heads:
    """Nested heads over one random [Vmax, d] matrix, packed once (smaller heads share the
    blocks of their prefix, as the engine's RowPacker shares them)."""

    def __init__(self, vmax: int, d: int, dtype: torch.dtype, device: torch.device) -> None:
        gen = torch.Generator().manual_seed(1234)
        self.w = (torch.randn(vmax, d, generator=gen) / d**0.5).to(dtype).to(device)
        self.packer = RowPacker() if packing_supported(self.w) else None
        self._packed: dict[int, PackedRows] = {}

    def rows(self, vocab: int) -> torch.Tensor:
        return self.w[:vocab]

    def packed(self, vocab: int) -> PackedRows | None:
        if self.packer is None:
            return None
        if vocab not in self._packed:
            self._packed[vocab] = self.packer.pack(self.w[:vocab])
        return self._packed[vocab]


def _interleaved(fns: list[Callable[[], object]], repeats: int) -> list[float]:
    """Median seconds of each fn, timed in rounds that call every fn once, so a change in the
    machine's load (others share this CPU) lands on all paths alike. The matrix (hundreds of
    MB at the demo's shape) is far past any LLC: no weight rotation needed."""
    times: list[list[float]] = [[] for _ in fns]
    for r in range(repeats + 1):  # round 0 warms up
        for i, fn in enumerate(fns):
            cuda = torch.cuda.is_available()
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            if cuda:
                torch.cuda.synchronize()
            if r:
                times[i].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def bench_mix(mix: dict[int, int], heads: _Heads, d: int, dtype: torch.dtype, mode: str,
              device: DeviceSpec, repeats: int) -> MixRow:
    cal = load_calibration(device.name)
    dt, s = dtype_name(dtype), DTYPE_BYTES[dtype_name(dtype)]
    dev = heads.w.device
    vmax, b = max(mix), sum(mix.values())
    order = sorted(mix.items(), reverse=True)
    h = hidden_states(b, d, dtype, dev)
    batch = mode_batch(mode, b)
    row_vocab = torch.tensor([v for v, n in order for _ in range(n)], device=dev)
    spans, at = [], 0
    for v, n in order:
        spans.append((v, at, at + n))
        at += n

    def sub(lo: int, hi: int) -> SamplingBatch:
        return SamplingBatch(batch.temperature[lo:hi], batch.top_p[lo:hi], batch.top_k[lo:hi],
                             batch.seed[lo:hi], batch.position[lo:hi], batch.want_logprobs)

    alone_plan = choose(b, vmax, d, dt, batch_mode(batch, vmax), device, cal)
    other = KernelChoice("split" if alone_plan.kernel != "split" else stream_kernel(device),
                         alone_plan.b_star, "bench")
    group_plans = [(v, lo, hi, choose(hi - lo, v, d, dt, batch_mode(sub(lo, hi), v), device, cal))
                   for v, lo, hi in spans]
    shapes = [GroupShape(n, v) for v, n in order]
    step_mode = batch_mode(batch, row_vocab)
    nested_plan = choose(effective_batch(shapes), vmax, d, dt, step_mode, device, cal)
    picks = plan_nested(shapes, d, dt, step_mode, device, cal)

    def alone(plan: KernelChoice) -> Callable[[], object]:
        return lambda: run_plan(plan, h, heads.rows(vmax), batch, None, heads.packed(vmax))

    def before() -> object:
        return [run_plan(p, h[lo:hi], heads.rows(v), sub(lo, hi), None, heads.packed(v))
                for v, lo, hi, p in group_plans]

    def after() -> object:
        return nested.unembed_and_sample(nested_plan.kernel, h, heads.rows(vmax), row_vocab,
                                         batch, None, heads.packed(vmax))

    t_plan, t_other, t_before, t_after = _interleaved(
        [alone(alone_plan), alone(other), before, after], repeats)
    t_alone = min(t_plan, t_other)
    alone_kernel = alone_plan.kernel if t_plan <= t_other else other.kernel
    w_max = vmax * d * s
    w_groups = sum(v * d * s for v in mix)
    return MixRow(
        mix_name(mix), b, d, dt, mode, t_alone * 1e3, t_plan * 1e3, t_before * 1e3,
        t_after * 1e3, w_max / t_alone / 1e9, w_groups / t_before / 1e9, w_max / t_after / 1e9,
        alone_kernel, t_before / t_alone, t_after / t_alone, nested_plan.kernel,
        "nested" if picks.nested else "per-group", t_after / t_alone <= TARGET,
    )


def run_mixed(mixes: list[dict[int, int]], d: int, dtype: torch.dtype, mode: str,
              device: DeviceSpec, torch_device: torch.device, repeats: int) -> list[MixRow]:
    heads = _Heads(max(max(m) for m in mixes), d, dtype, torch_device)
    rows = []
    for mix in mixes:
        rows.append(bench_mix(mix, heads, d, dtype, mode, device, repeats))
        log.info("%s", rows[-1])
    return rows


def format_mixed(rows: list[MixRow]) -> str:
    head = (f"{'mix':<28}{'B':>3}{'alone ms':>10}{'(kernel)':>9}{'plan ms':>9}"
            f"{'before ms':>11}{'after ms':>10}"
            f"{'GB/s alone':>11}{'before':>8}{'after':>8}{'before x':>9}{'after x':>9}"
            f"{'kernel':>9}{'plan':>10}  target")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.mix:<28}{r.b:>3}{r.alone_ms:>10.2f}{r.alone_kernel:>9}{r.alone_plan_ms:>9.2f}"
            f"{r.before_ms:>11.2f}{r.after_ms:>10.2f}"
            f"{r.alone_gb_s:>11.1f}{r.before_gb_s:>8.1f}{r.after_gb_s:>8.1f}"
            f"{r.before_ratio:>9.3f}{r.after_ratio:>9.3f}{r.nested_kernel:>9}{r.plan_picks:>10}"
            f"  {'MET' if r.target_met else 'MISSED'}")
    lines.append(f'target: "mixed step <= {TARGET:.2f}x largest head alone at the same B, '
                 f'B <= 16": ' + ", ".join(
                     f"{r.mix} {'MET' if r.target_met else 'MISSED'}" for r in rows if r.b <= 16))
    return "\n".join(lines)


def write_mixed(rows: list[MixRow], device: DeviceSpec, out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "bench_mixed.json", "png": out / "bench_mixed.png"}
    doc = {"device": asdict(device), "target": TARGET, "rows": [asdict(r) for r in rows]}
    paths["json"].write_text(json.dumps(doc, indent=2) + "\n")
    _plot(rows, device, paths["png"])
    return paths


def _plot(rows: list[MixRow], device: DeviceSpec, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(rows)), 4))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r.before_ratio for r in rows], 0.4, label="per group (before)")
    ax.bar([x + 0.2 for x in xs], [r.after_ratio for r in rows], 0.4, label="nested pass (after)")
    ax.axhline(1.0, color="k", lw=1)
    ax.axhline(TARGET, color="r", ls="--", lw=1, label=f"target {TARGET:.2f}x")
    ax.set_xticks(list(xs), [r.mix.replace("+", "\n") for r in rows], fontsize=7)
    ax.set_ylabel("step time ÷ largest head alone, same B")
    ax.set_title(f"mixed-head step on {device.name}, d={rows[0].d}, {rows[0].dtype}, "
                 f"{rows[0].mode}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

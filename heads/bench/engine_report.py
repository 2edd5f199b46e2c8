"""`polyhead bench engine`'s output: ratios between engines of one run, the table, the target
verdicts (MET / MISSED), JSON and PNG.

Engines: "local", "transformers", "vllm" (the multi-head plugin), "vllm-stock" (stock vLLM on
each head's own export) and "vllm-mixed" (the plugin on a batch split between the smallest
and the largest head; its row's head is "<small>+<large>").
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

BASELINE = "transformers"
PLUGIN, STOCK, MIXED = "vllm", "vllm-stock", "vllm-mixed"
# The local engine serving a split head's two-level reading, beside the native head alone
# and a batch split between both (head "<reading>|<native>").
READING = "local-reading"


@dataclass(frozen=True, slots=True)
class BenchRow:
    engine: str
    head: str
    vocab_size: int
    batch: int
    threads: int
    new_tokens: int
    ms_per_step: float
    decode_tok_s: float
    note: str = ""
    # A mixed row's largest head alone, on the same prompt and in turns with the mix.
    alone_ms_per_step: float | None = None
    dtype: str = ""  # the compute dtype this engine ran (vLLM: what its `dtype` resolved to)
    # Local engine: bytes of weights its one-row step reads (integer groups where it read them,
    # the compute dtype elsewhere); 0 where not counted.
    weight_bytes: int = 0


def _cell(rows: list[BenchRow], engine: str, head: str, batch: int) -> BenchRow | None:
    return next((r for r in rows if r.engine == engine and r.head == head and r.batch == batch
                 and r.decode_tok_s == r.decode_tok_s), None)


def ratio(rows: list[BenchRow], row: BenchRow, baseline: str = BASELINE) -> float | None:
    """row's decode tok/s ÷ the baseline engine's on the same head and B."""
    base = _cell(rows, baseline, row.head, row.batch)
    if base is None or row.decode_tok_s != row.decode_tok_s:
        return None
    return row.decode_tok_s / base.decode_tok_s


def mixed_ratio(rows: list[BenchRow], row: BenchRow) -> float | None:
    """A mixed row's ms/step ÷ its engine's ms/step on the largest head alone, same B (for
    a reading's rows: the native head alone, which decodes the same bytes per token)."""
    if row.engine not in (MIXED, READING) or not row.alone_ms_per_step:
        return None
    return row.ms_per_step / row.alone_ms_per_step


def reading_lines(rows: list[BenchRow]) -> list[str]:
    """Per reading and B: its step and a half-and-half batch's, ÷ the native head alone."""
    out = []
    for r in rows:
        x = mixed_ratio(rows, r)
        if r.engine == READING and x is not None and r.ms_per_step != r.alone_ms_per_step:
            out.append(f"{r.head} B={r.batch}: {r.ms_per_step:.1f} ms/step = {x:.2f}x the "
                       f"native head alone ({r.alone_ms_per_step:.1f}), same bytes/token")
    return out


def table(rows: list[BenchRow]) -> str:
    def fmt(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}x"

    lines = [f"{'engine':<14}{'head':<17}{'V':>8}{'B':>5}{'thr':>4}{'dtype':>10}{'ms/step':>10}"
             f"{'tok/s':>10}{'vs ' + BASELINE:>17}{'vs vllm':>9}{'vs stock':>10}  note"]
    for r in rows:
        lines.append(f"{r.engine:<14}{r.head:<17}{r.vocab_size:>8}{r.batch:>5}{r.threads:>4}"
                     f"{r.dtype:>10}{r.ms_per_step:>10.1f}{r.decode_tok_s:>10.1f}"
                     f"{fmt(ratio(rows, r)):>17}"
                     f"{fmt(ratio(rows, r, PLUGIN)):>9}{fmt(ratio(rows, r, STOCK)):>10}"
                     f"  {r.note}")
    return "\n".join(lines)


def _floor_verdict(rows: list[BenchRow], engine: str, baseline: str, target: float) -> str | None:
    """MET when engine ÷ baseline (decode tok/s) is >= target in every (head, B) cell."""
    cells = [(r, x) for r in rows if r.engine == engine
             and (x := ratio(rows, r, baseline)) is not None]
    if not cells:
        return None
    worst, x = min(cells, key=lambda c: c[1])
    verdict = "MET" if x >= target else "MISSED"
    return (f"target {engine} >= {target:.2f}x {baseline} decode tok/s in every cell: {verdict} "
            f"(lowest {x:.2f}x at {worst.head} B={worst.batch}, {len(cells)} cells)")


def _mixed_verdict(rows: list[BenchRow], target: float) -> str | None:
    cells = [(r, x) for r in rows
             if r.engine == MIXED and (x := mixed_ratio(rows, r)) is not None]
    if not cells:
        return None
    worst, x = max(cells, key=lambda c: c[1])
    verdict = "MET" if x <= target else "MISSED"
    return (f"target {MIXED} ms/step <= {target:.2f}x {PLUGIN} on the largest head alone: "
            f"{verdict} (highest {x:.2f}x at {worst.head} B={worst.batch}, {len(cells)} cells)")


def verdicts(rows: list[BenchRow]) -> list[str]:
    """The targets against stock vLLM when it ran; otherwise local against the plugin."""
    if any(r.engine == STOCK for r in rows):
        lines = [_floor_verdict(rows, PLUGIN, STOCK, 0.95),
                 _floor_verdict(rows, "local", STOCK, 1.0), _mixed_verdict(rows, 1.05)]
    else:
        lines = [_floor_verdict(rows, "local", PLUGIN, 1.0), _mixed_verdict(rows, 1.05)]
    return [line for line in lines if line is not None]


ROOFLINE_TARGET = 0.80  # the local engine's B=1 step against the memory bound
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def roofline_lines(rows: list[BenchRow], backbone_params: int, d: int,
                   read_bw: float) -> list[str]:
    """The local engine's B=1 steps against the memory roofline: the bytes of weights a step
    must read (the backbone's projections and the head's V rows, in the dtype it ran) over a
    bandwidth measured on this machine in the same run (kernels.machine.read_bandwidth)."""
    out, worst = [], None
    for r in rows:
        if r.engine != "local" or r.batch != 1 or r.dtype not in _BYTES or "+" in r.head:
            continue
        weights = r.weight_bytes or (backbone_params + r.vocab_size * d) * _BYTES[r.dtype]  # B
        bound_ms = 1e3 * weights / read_bw
        frac = bound_ms / r.ms_per_step
        out.append(f"local {r.head} B=1: {weights / 1e6:.0f} MB of weights per step "
                   f"({r.dtype} engine), "
                   f"bound {bound_ms:.1f} ms at {read_bw / 1e9:.1f} GB/s, step {r.ms_per_step:.1f}"
                   f" ms: {frac:.0%} of the memory roofline")
        worst = frac if worst is None else min(worst, frac)
    if worst is not None:
        out.append(f"target local B=1 step >= {ROOFLINE_TARGET:.0%} of the memory roofline: "
                   f"{'MET' if worst >= ROOFLINE_TARGET else 'MISSED'} (lowest {worst:.0%})")
    return out


def write(rows: list[BenchRow], out: Path) -> tuple[Path, Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    js = out / "bench_engine.json"
    js.write_text(json.dumps([{**asdict(r), "ratio_vs_" + BASELINE: ratio(rows, r),
                               "ratio_vs_vllm": ratio(rows, r, PLUGIN),
                               "ratio_vs_vllm_stock": ratio(rows, r, STOCK),
                               "mixed_vs_largest_alone": mixed_ratio(rows, r)}
                              for r in rows], indent=2) + "\n")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    styles = {"local": "-", STOCK: ":"}
    for key in dict.fromkeys((r.engine, r.head) for r in rows):
        rs = [r for r in rows if (r.engine, r.head) == key and r.decode_tok_s == r.decode_tok_s]
        if rs:
            ax.plot([r.batch for r in rs], [r.decode_tok_s for r in rs], marker="o",
                    linestyle=styles.get(key[0], "--"), label=f"{key[0]} {key[1]}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch B")
    ax.set_ylabel("decode tokens / s")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"decode speed, {rows[0].threads} thread(s), {rows[0].new_tokens} new tokens")
    fig.tight_layout()
    png = out / "bench_engine.png"
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return js, png

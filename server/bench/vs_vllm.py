"""polyhead serve against stock `vllm serve`, measured with vLLM's own `vllm bench serve` on
the same prompts, one server after the other on the same machine. Stock runs at its own
defaults (no `--dtype`: vLLM's CPU backend picks bf16 for Gemma-3) on two exports: the native
head ("stock", what runs without polyhead) and the 131k head ("stock-131k", what an operator
could serve with polyhead's exporter alone). With `--llama-cpp PATH`, llama.cpp's
`llama-server` on the model's GGUF too ("llama.cpp", server.bench.llama_cpp).

Per prompt set and concurrency: output tok/s and output bytes/s (a smaller head's token
carries fewer bytes, so bytes are the fair unit), median TTFT and TPOT, polyhead's share per
head, and the served heads' BPB (the manifest's held-out measurement, weighted by share)
against the native head's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from heads.manifest import Manifest
from server.bench.gateway import served

DATA = Path(__file__).parent / "data"
PROMPT_SETS = {"english": DATA / "prompts_en.jsonl",
               "multilingual": DATA / "prompts_multilingual.jsonl"}
# polyhead ÷ stock output bytes/s: against stock on the native head, and on the second
# largest head's export (the cheapest static head an operator could run without the router).
TARGET_RATIO = 1.3
TARGET_RATIO_SMALLER = 1.0
# against llama-server on the same GGUF: the router by TARGET_RATIO, the native head pinned by
# TARGET_LLAMA_NATIVE (the same model both sides).
TARGET_LLAMA_NATIVE = 1.0
BPB_SLACK = 0.05  # served BPB within 5% of the native head's


@dataclass(frozen=True, slots=True)
class Cell:
    server: str  # "polyhead" | "polyhead:<head>" (pinned) | "stock" (native) | "stock-<head>"
    # | "llama.cpp" (llama-server on the GGUF: the native head)
    prompts: str
    concurrency: int
    completed: int
    failed: int
    tok_s: float
    bytes_s: float
    ttft_ms: float  # median
    tpot_ms: float  # median
    shares: dict[str, float]  # polyhead: head -> share of requests


def bench_serve(url: str, model: str, tokenizer: Path, prompts: Path, concurrency: int,
                n: int, output_len: int, out: Path, endpoint: str = "/v1/completions") -> dict:
    """One `vllm bench serve` run (custom dataset, greedy, --ignore-eos); its result JSON.
    `endpoint`: polyhead's per-head route (/heads/<head>/v1/completions) pins a head."""
    out.mkdir(parents=True, exist_ok=True)
    name = f"c{concurrency}.json"
    cmd = [sys.executable, "-m", "server.bench.vllm_serve_bench", "--backend", "openai",
           "--base-url", url, "--endpoint", endpoint, "--model", model,
           "--tokenizer", str(tokenizer), "--dataset-name", "custom", "--dataset-path",
           str(prompts), "--custom-output-len", str(output_len), "--skip-chat-template",
           "--num-prompts", str(n), "--max-concurrency", str(concurrency), "--ignore-eos",
           "--temperature", "0", "--save-result", "--save-detailed", "--result-dir", str(out),
           "--result-filename", name, "--seed", "0"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed: {done.stderr[-2000:]}")
    return json.loads((out / name).read_text())


def cell(server: str, prompts: str, concurrency: int, r: dict,
         shares: dict[str, float]) -> Cell:
    text_bytes = sum(len(t.encode()) for t in r.get("generated_texts", []))
    return Cell(server, prompts, concurrency, r["completed"], r.get("failed", 0),
                r["output_throughput"], text_bytes / r["duration"], r["median_ttft_ms"],
                r["median_tpot_ms"], shares)


def decisions(url: str) -> dict[str, float]:
    """polyhead_decisions_total summed per head, from /metrics."""
    out: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("polyhead_decisions_total{"):
            head = line.split('head="')[1].split('"')[0]
            out[head] = out.get(head, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def share_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    delta = {h: after.get(h, 0.0) - before.get(h, 0.0) for h in after}
    total = sum(delta.values()) or 1.0
    return {h: round(v / total, 3) for h, v in sorted(delta.items()) if v}


def native_export(model_dir: Path, manifest: Manifest, cache_dir: Path,
                  head: str | None = None) -> Path:
    """A head's standard vLLM directory (`export vllm --per-head`), exported into the cache on
    first use; by default the native head's: the model an operator serves without polyhead."""
    from heads.vllm_plugin.export import export_vllm_per_head

    name = head or manifest.native.name
    out = cache_dir / "exports" / f"{model_dir.name}-per-head"
    # An export without tokenizer_config.json predates the BOS-prepending tokenizer: redo it.
    if not all((out / name / f).is_file() for f in ("config.json", "tokenizer_config.json")):
        export_vllm_per_head(model_dir, out)
    return out / name


def second_largest(manifest: Manifest) -> str | None:
    """The largest head below the native one that is not a reading (131k on the demo)."""
    native = manifest.native
    rest = [h for h in manifest.heads if h.reads is None and h.name != native.name]
    return max(rest, key=lambda h: h.vocab_size).name if rest else None


@contextmanager
def stock_server(model_dir: Path, port: int, log: Path) -> Iterator[str]:
    """Stock vLLM's OpenAI server on one exported head, at vLLM's own defaults (no --dtype:
    its CPU backend resolves auto to bf16 for Gemma-3), on the CPU platform."""
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu",
           "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
           str(model_dir), "--served-model-name", "stock",
           "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "2048"]
    with served(cmd, env, port, log, ready_path="/health", ready_s=600) as s:
        yield s.url


def served_bpb(manifest: Manifest, shares: dict[str, float]) -> float | None:
    bpbs = {h.name: h.bpb for h in manifest.heads}
    if not shares or any(bpbs.get(h) is None for h in shares):
        return None
    return sum(s * (bpbs[h] or 0.0) for h, s in shares.items())


def verdicts(cells: list[Cell], manifest: Manifest) -> list[str]:
    """The router against every baseline; a pinned head against stock on that head alone,
    and the native head pinned against llama.cpp, at >= 1.00x (the same model both sides:
    what is left is the engine)."""
    native = manifest.native
    lines = []
    for p in cells:
        if not p.server.startswith("polyhead"):
            continue
        pinned = p.server.partition(":")[2]
        shares = {pinned: 1.0} if pinned else p.shares
        bpb = served_bpb(manifest, shares)
        within = bpb is not None and native.bpb is not None and \
            bpb <= native.bpb * (1 + BPB_SLACK)
        for c in cells:
            if c.server.startswith("polyhead") or c.prompts != p.prompts or \
                    c.concurrency != p.concurrency:
                continue
            same = c.server == ("stock" if pinned == native.name else f"stock-{pinned}") or (
                c.server == "llama.cpp" and pinned == native.name)
            if pinned and not same:
                continue
            if c.server == "llama.cpp":
                target = TARGET_LLAMA_NATIVE if pinned else TARGET_RATIO
            else:
                target = TARGET_RATIO if c.server == "stock" and not pinned \
                    else TARGET_RATIO_SMALLER
            ratio = p.bytes_s / c.bytes_s if c.bytes_s else float("nan")
            met = ratio >= target and within
            lines.append(f"{'MET' if met else 'MISSED'} {p.server} {p.prompts} "
                         f"c={p.concurrency}: bytes/s {ratio:.2f}x {c.server} "
                         f"(target >= {target}x), served BPB "
                         f"{'n/a' if bpb is None else f'{bpb:.4f}'} vs native {native.bpb} "
                         f"(within {BPB_SLACK:.0%}: {within})" + _failures(p, c))
    return lines


def _failures(*cells: Cell) -> str:
    """A verdict's note of failed requests: its bytes/s counts only the completed ones."""
    failed = [f"{c.server} {c.failed} of {c.completed + c.failed}" for c in cells if c.failed]
    return f"; requests failed: {', '.join(failed)}" if failed else ""


def table(cells: list[Cell]) -> str:
    head = (f"{'prompts':<13}{'c':>4} {'server':<15}{'done':>5}{'fail':>5}{'tok/s':>8}"
            f"{'bytes/s':>9}{'TTFT ms':>9}{'TPOT ms':>9}  shares")
    rows = [head]
    for c in cells:
        rows.append(f"{c.prompts:<13}{c.concurrency:>4} {c.server:<15}{c.completed:>5}"
                    f"{c.failed:>5}{c.tok_s:>8.1f}{c.bytes_s:>9.1f}{c.ttft_ms:>9.0f}"
                    f"{c.tpot_ms:>9.0f}  {json.dumps(c.shares) if c.shares else ''}")
    return "\n".join(rows)


def write(cells: list[Cell], lines: list[str], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "vs_vllm.json"
    path.write_text(json.dumps({"cells": [asdict(c) for c in cells], "verdicts": lines},
                               indent=2))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PROMPT_SETS), figsize=(10, 4), squeeze=False)
    for ax, prompts in zip(axes[0], PROMPT_SETS, strict=True):
        for server in sorted({c.server for c in cells}):
            pts = [c for c in cells if c.server == server and c.prompts == prompts]
            ax.plot([c.concurrency for c in pts], [c.bytes_s for c in pts], "o-", label=server)
        ax.set(title=prompts, xlabel="concurrency", ylabel="output bytes/s", xscale="log")
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "vs_vllm.png", dpi=120)
    plt.close(fig)
    return path


def logs_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="polyhead-vs-vllm-"))

"""Decode speed per head: the local engine against `transformers.generate` (and vLLM when
importable), same weights, dtype and thread count, greedy, a fixed number of new tokens.

Decode time is isolated by difference: a run generating N tokens minus a run generating 1
(prefill plus the first sample), so ms/step = (t_N - t_1) / (N - 1) and decode tok/s =
B (N - 1) / (t_N - t_1) for every engine alike. EOS never stops a run.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from heads.engine.config import EngineConfig
from heads.engine.llm_engine import LocalEngine
from heads.engine.types import GenerationRequest, StepTiming
from heads.manifest import BackboneConfig, HeadSpec
from heads.model.weights import Checkpoint, load_checkpoint
from kernels.row_params import RowParams

log = logging.getLogger(__name__)

PROMPT = "Once upon a time, in a small village by the sea,"
BASELINE = "transformers"


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


Runner = Callable[[list[int], int, int], float]  # (prompt ids, batch, new tokens) -> seconds


def _local_runner(ckpt: Checkpoint, head: str, max_batch: int, max_len: int,
                  timings: list[StepTiming] | None = None) -> Runner:
    """`timings`, when given, collects every measured decode step (the calibration file)."""
    cfg = EngineConfig(num_kv_blocks=max_batch * (-(-max_len // 16) + 1) + 4,
                       max_num_seqs=max_batch, max_num_batched_tokens=max(1024, max_batch * 64))
    engine = LocalEngine(ckpt.model, cfg)

    async def go(ids: list[int], batch: int, n: int) -> float:
        await engine.start()
        reqs = [GenerationRequest(f"b{i}", head, tuple(ids), n, RowParams(temperature=0.0),
                                  frozenset()) for i in range(batch)]
        t0 = time.perf_counter()

        async def one(r: GenerationRequest) -> int:
            return sum([1 async for _ in engine.generate(r)])

        counts = await asyncio.gather(*(one(r) for r in reqs))
        dt = time.perf_counter() - t0
        assert all(c == n for c in counts), counts
        steps = engine.drain_step_timings()
        if timings is not None:
            timings.extend(t for t in steps if not t.prefill)
        return dt

    loop = asyncio.new_event_loop()
    return lambda ids, batch, n: loop.run_until_complete(go(ids, batch, n))


def hf_config(b: BackboneConfig, vocab_size: int) -> Any:
    import transformers

    common: dict[str, Any] = dict(vocab_size=vocab_size, hidden_size=b.hidden_size,
                  intermediate_size=b.intermediate_size, num_hidden_layers=b.num_layers,
                  num_attention_heads=b.num_heads, num_key_value_heads=b.num_kv_heads,
                  head_dim=b.head_dim, rms_norm_eps=b.rms_norm_eps,
                  max_position_embeddings=b.max_position_embeddings, tie_word_embeddings=True,
                  pad_token_id=None, bos_token_id=None, eos_token_id=None)
    if b.architecture == "llama":
        return transformers.LlamaConfig(
            **common, rope_parameters={"rope_type": "default", "rope_theta": b.rope_theta})
    full: dict[str, Any] = {"rope_type": "default", "rope_theta": b.rope_theta}
    if b.rope_linear_factor:
        full = {"rope_type": "linear", "factor": b.rope_linear_factor, "rope_theta": b.rope_theta}
    return transformers.Gemma3TextConfig(
        **common, sliding_window=b.sliding_window, layer_types=list(b.layer_types) or None,
        query_pre_attn_scalar=int(b.query_pre_attn_scalar or b.head_dim),
        final_logit_softcapping=b.final_logit_softcapping,
        rope_parameters={"full_attention": full, "sliding_attention": {
            "rope_type": "default", "rope_theta": b.rope_local_theta or b.rope_theta}})


def hf_model(ckpt: Checkpoint, head: HeadSpec) -> Any:
    """A transformers CausalLM holding the backbone and this head's rows (tied)."""
    import transformers

    b = ckpt.manifest.backbone
    cls: Any = (transformers.LlamaForCausalLM if b.architecture == "llama"
           else transformers.Gemma3ForCausalLM)
    model = cls(hf_config(b, head.vocab_size))  # real buffers (RoPE, embed scale); ~1 s
    sd = {f"model.{k}": v for k, v in ckpt.model.backbone.state_dict().items()}
    sd["model.embed_tokens.weight"] = ckpt.model.unembedding_rows(head.name)
    missing, unexpected = model.load_state_dict(sd, strict=False, assign=True)
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise RuntimeError(f"transformers model: missing {missing[:3]}, unexpected "
                           f"{unexpected[:3]}")
    model.tie_weights()
    return model.to(ckpt.model.dtype).eval()


def _hf_runner(ckpt: Checkpoint, head: HeadSpec) -> Runner:
    model = hf_model(ckpt, head)

    @torch.inference_mode()
    def run(ids: list[int], batch: int, n: int) -> float:
        x = torch.tensor([ids] * batch)
        t0 = time.perf_counter()
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n,
                             min_new_tokens=n, do_sample=False, pad_token_id=0)
        dt = time.perf_counter() - t0
        assert out.shape == (batch, len(ids) + n), out.shape
        return dt

    return run


def _measure(run: Runner, ids: list[int], batch: int, n: int, repeats: int) -> float:
    """Best of `repeats` of (t_n - t_1), after one warm-up."""
    run(ids, batch, 2)
    best = float("inf")
    for _ in range(repeats):
        best = min(best, run(ids, batch, n) - run(ids, batch, 1))
    return max(best, 1e-9)


def bench(model_dir: Path, batches: list[int], new_tokens: int, threads: int,
          engines: list[str], repeats: int = 1, heads: list[str] | None = None,
          dtype: str | None = None, timings: list[StepTiming] | None = None) -> list[BenchRow]:
    """`dtype` overrides the checkpoint's dtype for every engine alike (None keeps it).
    `timings`, when given, receives the local engine's measured decode steps."""
    torch.set_num_threads(threads)
    ckpt = load_checkpoint(model_dir, compute_dtype=dtype)
    rows: list[BenchRow] = []
    vllm = None
    if "vllm" in engines and importlib.util.find_spec("vllm") is None:
        log.warning("vllm is not importable here; skipping it")
        rows.append(BenchRow("vllm", "*", 0, 0, threads, new_tokens, float("nan"),
                             float("nan"), "skipped: vllm is not installed"))
    elif "vllm" in engines:
        from heads.bench.vllm_runner import VllmBench

        longest = max(len(t.encode(PROMPT)) for t in ckpt.tokenizers.values()) + 1
        vllm = VllmBench(model_dir, dtype, max(batches), longest + new_tokens)
    try:
        _bench_heads(ckpt, batches, new_tokens, threads, engines, repeats, heads, timings,
                     vllm, rows)
    finally:
        if vllm is not None:
            vllm.close()
    return rows


def _bench_heads(ckpt: Checkpoint, batches: list[int], new_tokens: int, threads: int,
                 engines: list[str], repeats: int, heads: list[str] | None,
                 timings: list[StepTiming] | None, vllm: Any, rows: list[BenchRow]) -> None:
    for h in sorted(ckpt.manifest.heads, key=lambda h: h.vocab_size):
        if heads and h.name not in heads:
            continue
        ids = ckpt.tokenizers[h.name].encode(PROMPT)
        if h.bos_token_id is not None:
            ids = [h.bos_token_id, *ids]
        for engine in engines:
            if engine == "vllm" and vllm is None:
                continue
            if engine == "vllm":
                assert vllm is not None
                run = vllm.runner(h.name)
            elif engine == "local":
                run = _local_runner(ckpt, h.name, max(batches), len(ids) + new_tokens, timings)
            else:
                run = _hf_runner(ckpt, h)
            for b in batches:
                dt = _measure(run, ids, b, new_tokens, repeats)
                steps = new_tokens - 1
                row = BenchRow(engine, h.name, h.vocab_size, b, threads, new_tokens,
                               1000 * dt / steps, b * steps / dt)
                log.info("%s %s B=%d: %.1f tok/s, %.1f ms/step", engine, h.name, b,
                         row.decode_tok_s, row.ms_per_step)
                rows.append(row)


def ratio(rows: list[BenchRow], row: BenchRow, baseline: str = BASELINE) -> float | None:
    base = [r for r in rows if r.engine == baseline and r.head == row.head
            and r.batch == row.batch]
    if not base or row.decode_tok_s != row.decode_tok_s:
        return None
    return row.decode_tok_s / base[0].decode_tok_s


def table(rows: list[BenchRow]) -> str:
    lines = [f"{'engine':<13}{'head':<7}{'V':>8}{'B':>5}{'thr':>4}{'ms/step':>10}"
             f"{'tok/s':>10}{'vs ' + BASELINE:>17}{'vs vllm':>9}  note"]
    for r in rows:
        x, v = ratio(rows, r), ratio(rows, r, "vllm")
        lines.append(f"{r.engine:<13}{r.head:<7}{r.vocab_size:>8}{r.batch:>5}{r.threads:>4}"
                     f"{r.ms_per_step:>10.1f}{r.decode_tok_s:>10.1f}"
                     f"{'-' if x is None else f'{x:.2f}x':>17}"
                     f"{'-' if v is None else f'{v:.2f}x':>9}  {r.note}")
    return "\n".join(lines)


def vllm_target(rows: list[BenchRow], target: float = 1.0) -> str | None:
    """The local engine against vLLM: MET when every (head, B) cell is >= target."""
    cells: list[tuple[BenchRow, float]] = []
    for r in rows:
        x = ratio(rows, r, "vllm") if r.engine == "local" else None
        if x is not None:
            cells.append((r, x))
    if not cells:
        return None
    worst, x = min(cells, key=lambda c: c[1])
    verdict = "MET" if x >= target else "MISSED"
    return (f"target local >= {target:.1f}x vllm decode tok/s in every cell: {verdict} "
            f"(lowest {x:.2f}x at {worst.head} B={worst.batch}, {len(cells)} cells)")


def write(rows: list[BenchRow], out: Path) -> tuple[Path, Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    js = out / "bench_engine.json"
    js.write_text(json.dumps([{**asdict(r), "ratio_vs_" + BASELINE: ratio(rows, r),
                               "ratio_vs_vllm": ratio(rows, r, "vllm")}
                              for r in rows], indent=2) + "\n")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key in dict.fromkeys((r.engine, r.head) for r in rows):
        rs = [r for r in rows if (r.engine, r.head) == key and r.decode_tok_s == r.decode_tok_s]
        if rs:
            ax.plot([r.batch for r in rs], [r.decode_tok_s for r in rs], marker="o",
                    linestyle="-" if key[0] == "local" else "--", label=f"{key[0]} {key[1]}")
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

"""Decode speed per head: the local engine against `transformers.generate` (and vLLM when
importable), same weights, dtype and thread count, greedy, a fixed number of new tokens.

Decode time is isolated by difference: a run generating N tokens minus a run generating 1
(prefill plus the first sample), so ms/step = (t_N - t_1) / (N - 1) and decode tok/s =
B (N - 1) / (t_N - t_1) for every engine alike. EOS never stops a run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from heads.bench.engine_report import MIXED, PLUGIN, READING, STOCK, BenchRow
from heads.engine.config import EngineConfig
from heads.engine.cpu_linear import auto_compute_dtype
from heads.engine.grouped_reading import GroupedReading
from heads.engine.llm_engine import LocalEngine
from heads.engine.types import GenerationRequest, StepTiming
from heads.manifest import BackboneConfig, HeadSpec
from heads.model.multi_head import MultiHeadModel
from heads.model.weights import Checkpoint, load_checkpoint
from kernels.row_params import RowParams

log = logging.getLogger(__name__)

PROMPT = "Once upon a time, in a small village by the sea,"


Runner = Callable[[list[int], int, int], float]  # (prompt ids, batch, new tokens) -> seconds


def _local_runner(ckpt: Checkpoint, head: str | tuple[str, ...], max_batch: int, max_len: int,
                  timings: list[StepTiming] | None = None,
                  readings: tuple[GroupedReading, ...] = (), weights: str = "auto") -> Runner:
    """`timings`, when given, collects every measured decode step (the calibration file).
    Several heads: the batch's requests take them in turn."""
    heads = (head,) if isinstance(head, str) else head
    cfg = EngineConfig(num_kv_blocks=max_batch * (-(-max_len // 16) + 1) + 4,
                       max_num_seqs=max_batch, max_num_batched_tokens=max(1024, max_batch * 64),
                       weights=weights)
    engine = LocalEngine(ckpt.model, cfg, readings=readings)

    async def go(ids: list[int], batch: int, n: int) -> float:
        await engine.start()
        reqs = [GenerationRequest(f"b{i}", heads[i % len(heads)], tuple(ids), n,
                                  RowParams(temperature=0.0), frozenset())
                for i in range(batch)]
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


def _measure(runs: dict[str, Runner], ids: list[int], batch: int, n: int,
             repeats: int) -> dict[str, float]:
    """Engine -> best of `repeats` of (t_n - t_1), after one warm-up each. The engines take
    turns within every repeat, so a load change on a shared machine lands on all of them
    and their ratios stay fair."""
    for run in runs.values():
        run(ids, batch, 2)
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeats):
        for engine, run in runs.items():
            best[engine] = min(best[engine], run(ids, batch, n) - run(ids, batch, 1))
    return {e: max(t, 1e-9) for e, t in best.items()}


def bench(model_dir: Path, batches: list[int], new_tokens: int, threads: int,
          engines: list[str], repeats: int = 1, heads: list[str] | None = None,
          dtype: str | None = None, timings: list[StepTiming] | None = None,
          grouped: list[str] | None = None, weights: str = "auto") -> list[BenchRow]:
    """`dtype` overrides the checkpoint's dtype for every engine alike (None keeps it);
    "auto" lets each engine pick its own default, as `serve` and stock vLLM do.
    `timings`, when given, receives the local engine's measured decode steps. `grouped`:
    split heads whose two-level readings the local engine also runs, in turns with the
    native head (`_bench_readings`). `weights`: which bytes the local engine's products
    read (kernels.precision; one policy per process, as the packing is the model's)."""
    torch.set_num_threads(threads)
    ckpt = load_checkpoint(model_dir, compute_dtype=auto_compute_dtype() if dtype == "auto"
                           else dtype, int8=weights != "bf16")
    vllm_dtype = None if dtype == "auto" else dtype  # None: vLLM's own "auto"
    rows: list[BenchRow] = []
    vllm: dict[str, Any] = {}
    wanted = [e for e in (PLUGIN, STOCK) if e in engines]
    if wanted and importlib.util.find_spec("vllm") is None:
        log.warning("vllm is not importable here; skipping %s", wanted)
        rows += [BenchRow(e, "*", 0, 0, threads, new_tokens, float("nan"), float("nan"),
                          "skipped: vllm is not installed") for e in wanted]
    elif wanted:
        from heads.bench.vllm_runner import StockVllmBench, VllmBench

        longest = max(len(t.encode(PROMPT)) for t in ckpt.tokenizers.values()) + 1
        kinds = {PLUGIN: VllmBench, STOCK: StockVllmBench}
        vllm = {e: kinds[e](model_dir, vllm_dtype, max(batches), longest + new_tokens)
                for e in wanted}
    try:
        _bench_heads(ckpt, batches, new_tokens, threads, engines, repeats, heads, timings,
                     vllm, rows, weights)
        if grouped:
            _bench_readings(ckpt, batches, new_tokens, threads, repeats, grouped, rows)
        if PLUGIN in vllm:
            _bench_mixed(ckpt, batches, new_tokens, threads, repeats, heads, vllm[PLUGIN], rows)
    finally:
        ran = {e: v.dtype() for e, v in vllm.items()}
        for v in vllm.values():
            v.close()
    ran[MIXED] = ran.get(PLUGIN, "")
    return [dataclasses.replace(r, dtype=ran.get(r.engine, ckpt.model.dtype_name)) for r in rows]


def _prompt(ckpt: Checkpoint, h: HeadSpec) -> list[int]:
    ids = ckpt.tokenizers[h.name].encode(PROMPT)
    return [h.bos_token_id, *ids] if h.bos_token_id is not None else ids


def _row(engine: str, head: str, vocab: int, batch: int, threads: int, new_tokens: int,
         dt: float, note: str = "") -> BenchRow:
    steps = new_tokens - 1
    row = BenchRow(engine, head, vocab, batch, threads, new_tokens, 1000 * dt / steps,
                   batch * steps / dt, note)
    log.info("%s %s B=%d: %.1f tok/s, %.1f ms/step", engine, head, batch, row.decode_tok_s,
             row.ms_per_step)
    return row


def _bench_heads(ckpt: Checkpoint, batches: list[int], new_tokens: int, threads: int,
                 engines: list[str], repeats: int, heads: list[str] | None,
                 timings: list[StepTiming] | None, vllm: dict[str, Any],
                 rows: list[BenchRow], weights: str = "auto") -> None:
    for h in sorted(ckpt.manifest.heads, key=lambda h: h.vocab_size):
        if heads and h.name not in heads:
            continue
        ids = _prompt(ckpt, h)
        runs: dict[str, Runner] = {}
        for engine in engines:
            if engine in (PLUGIN, STOCK):
                if engine in vllm:
                    runs[engine] = vllm[engine].runner(h.name)
            elif engine == "local":
                runs[engine] = _local_runner(ckpt, h.name, max(batches), len(ids) + new_tokens,
                                             timings, weights=weights)
            else:
                runs[engine] = _hf_runner(ckpt, h)
        for b in batches:
            for engine, dt in _measure(runs, ids, b, new_tokens, repeats).items():
                row = _row(engine, h.name, h.vocab_size, b, threads, new_tokens, dt)
                if engine == "local" and b == 1:
                    row = dataclasses.replace(row, weight_bytes=step_weight_bytes(
                        ckpt.model, h.name, weights != "bf16"))
                rows.append(row)


def step_weight_bytes(model: MultiHeadModel, head: str, int8: bool) -> int:
    """Bytes of weights a one-row decode step of `head` reads: each backbone matrix and the
    head's rows at their integer-group size where the engine reads those (`int8`), else in
    the compute dtype. Norm vectors count too; the input embedding's one row does not."""
    total = 0
    for name, p in model.backbone.state_dict().items():
        groups = model.int8.get("backbone." + name) if int8 else None
        total += groups.nbytes if groups is not None else p.numel() * p.element_size()
    rows = model.unembedding_rows(head)
    groups = model.int8_prefix(rows) if int8 else None
    return total + (groups.nbytes if groups is not None else rows.numel() * rows.element_size())


def _bench_mixed(ckpt: Checkpoint, batches: list[int], new_tokens: int, threads: int,
                 repeats: int, heads: list[str] | None, plugin: Any,
                 rows: list[BenchRow]) -> None:
    """The plugin on batches alternating the smallest and the largest head, each request on
    the smallest head's prompt (its local IDs are valid in the larger head too)."""
    chosen = sorted((h for h in ckpt.manifest.heads if not heads or h.name in heads),
                    key=lambda h: h.vocab_size)
    if len(chosen) < 2:
        return
    small, large = chosen[0], chosen[-1]
    run = plugin.mixed_runner([small.name, large.name])
    ids = _prompt(ckpt, small)
    alone = plugin.runner(large.name)
    for b in (b for b in batches if b >= 2):
        # The largest head alone on the same prompt, in turns with the mix: the verdict's
        # denominator, measured under the same load.
        dt = _measure({MIXED: run, PLUGIN: alone}, ids, b, new_tokens, repeats)
        alone_ms = 1000 * dt[PLUGIN] / (new_tokens - 1)
        row = _row(MIXED, f"{small.name}+{large.name}", large.vocab_size, b, threads,
                   new_tokens, dt[MIXED], f"{large.name} alone: {alone_ms:.1f} ms/step")
        rows.append(dataclasses.replace(row, alone_ms_per_step=alone_ms))


def _bench_readings(ckpt: Checkpoint, batches: list[int], new_tokens: int, threads: int,
                    repeats: int, grouped: list[str], rows: list[BenchRow]) -> None:
    """Each split head's two-level reading, in turns with the native head alone and with a
    batch split half and half between them, all on the native prompt (the reading emits
    native ids, so the three rows decode the same bytes per token)."""
    native = max(ckpt.manifest.heads, key=lambda h: h.vocab_size)
    ids = _prompt(ckpt, native)
    longest = len(ids) + new_tokens
    for head in grouped:
        reading = GroupedReading.of_split_head(ckpt.tokenizers, head)
        runs = {native.name: _local_runner(ckpt, native.name, max(batches), longest),
                reading.name: _local_runner(ckpt, reading.name, max(batches), longest,
                                            readings=(reading,)),
                f"{reading.name}|{native.name}": _local_runner(
                    ckpt, (reading.name, native.name), max(batches), longest,
                    readings=(reading,))}
        for b in batches:
            mixed = {k: r for k, r in runs.items() if b >= 2 or "|" not in k}
            dt = _measure(mixed, ids, b, new_tokens, repeats)
            alone_ms = 1000 * dt[native.name] / (new_tokens - 1)
            for name, t in dt.items():
                row = _row(READING, name, reading.vocab, b, threads, new_tokens, t,
                           f"{native.name} alone: {alone_ms:.1f} ms/step")
                rows.append(dataclasses.replace(row, alone_ms_per_step=alone_ms))

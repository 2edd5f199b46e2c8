"""The embedded backend's lifecycle on the tiny model: stop waits for the background
grammar build, so no thread is left running inside xgrammar while the process exits."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from heads.engine.config import EngineConfig
from heads.engine.grammar import GrammarCompiler
from heads.model.weights import load_checkpoint
from server.backends.local import LocalBackend


def test_stop_right_after_start_joins_the_grammar_build(tiny_model_dir: Path) -> None:
    ckpt = load_checkpoint(tiny_model_dir, compute_dtype="float32")
    native = max(ckpt.manifest.heads, key=lambda h: h.vocab_size)
    grammars = GrammarCompiler(ckpt.tokenizers[native.name], native.eos_token_ids)
    backend = LocalBackend(ckpt.model, EngineConfig(num_kv_blocks=64), grammars=grammars)

    async def start_then_stop() -> None:
        await backend.start()
        await backend.stop()

    asyncio.run(start_then_stop())
    assert not [t for t in threading.enumerate() if t.name == "grammar-warm"]
    # Joined, not abandoned: the table was finished, so a later compile needs no build.
    assert grammars.is_warm


def test_start_leaves_each_heads_measured_steps_for_the_calibration(tiny_model_dir: Path
                                                                    ) -> None:
    # The cold first steps are dropped; the measured round after them gives every head
    # MEASURED_TOKENS - 1 one-row decode steps, so none is priced by the fit alone.
    from server.backends.local import MEASURED_TOKENS

    ckpt = load_checkpoint(tiny_model_dir, compute_dtype="float32")
    backend = LocalBackend(ckpt.model, EngineConfig(num_kv_blocks=64))

    async def start_then_stop() -> list:
        await backend.start()
        try:
            return backend.step_timings()
        finally:
            await backend.stop()

    timings = [t for t in asyncio.run(start_then_stop()) if not t.prefill]
    for head in ckpt.manifest.heads:
        steps = [t for t in timings if t.groups[0][0] == head.name]
        assert len(steps) == MEASURED_TOKENS - 1
        assert all(t.groups[0][1] == 1 and t.seconds > 0 for t in steps)

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

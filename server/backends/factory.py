"""Pick the backend named by settings.backend."""

from __future__ import annotations

from heads.engine.config import EngineConfig
from heads.model.weights import Checkpoint
from server.backends.base import Backend
from server.settings import Settings


def make_backend(settings: Settings, ckpt: Checkpoint, econf: EngineConfig) -> Backend:
    """`ckpt` as served: its manifest holds the two-level readings it serves, if any."""
    if settings.backend == "echo":
        from server.backends.echo import EchoBackend

        return EchoBackend(list(ckpt.manifest.head_names), settings.echo_token_delay_s)
    from heads.engine.grammar import GrammarCompiler
    from heads.engine.grouped_reading import GroupedReading
    from server.backends.local import LocalBackend

    # Nested heads share the native head's ids: its grammar tables serve every head.
    native = ckpt.manifest.native
    grammars = GrammarCompiler(ckpt.tokenizers[native.name], native.eos_token_ids)
    readings = GroupedReading.served(ckpt)
    return LocalBackend(ckpt.model, econf, settings.torch_threads, grammars, readings)

"""Stock vLLM on one head's export, as a replay backend: the model an operator serves without
polyhead (`export vllm --per-head`; the native head, or a smaller one exported by polyhead),
in vLLM's own OpenAI server process at its own defaults, reached through polyhead's vLLM
backend pinned to that one head (offset 0, the head's own ids)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from heads.engine.types import GenerationRequest, LogitRules
from heads.manifest import Manifest
from kernels.row_params import RowParams
from server.backends.vllm.backend import VllmBackend
from server.backends.vllm.remote import RemoteReplica
from server.bench.gateway import free_port
from server.bench.vs_vllm import native_export, stock_server

log = logging.getLogger(__name__)


@asynccontextmanager
async def stock_vllm(model_dir: Path, manifest: Manifest, cache_dir: Path,
                     log_path: Path, head: str | None = None) -> AsyncIterator[VllmBackend]:
    """Started, warmed (a first request pays vLLM's lazy set-up, not a run) and stopped.
    `head`: the export served (default the native head)."""
    native = manifest.head(head) if head is not None else manifest.native
    directory = native_export(model_dir, manifest, cache_dir, native.name)
    log.info("starting stock vLLM on %s (log %s); about two minutes", directory, log_path)
    with stock_server(directory, free_port(), log_path) as url:
        replica = RemoteReplica(url, frozenset({native.name}), {native.name: 0}, "stock")
        backend = VllmBackend([replica], {native.name: native.vocab_size})
        await backend.start()
        try:
            first = native.bos_token_id if native.bos_token_id is not None else 0
            warm = GenerationRequest("stock-warm-up", native.name, (first,), 4,
                                     RowParams(temperature=0.0), frozenset(),
                                     rules=LogitRules(min_tokens=4))
            async for _ in backend.generate(warm):
                pass
            yield backend
        finally:
            await backend.stop()

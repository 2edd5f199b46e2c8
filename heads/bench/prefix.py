"""Two local-engine scenarios for `polyhead bench engine`: prefix-cache TTFT and KV per request.

- Prefix cache: a shared system prompt (1.5k tokens by default) then a short user turn.
  Cold: the first request with a system prompt the cache has never seen. Warm: the next
  request with the same system prompt and another user turn. TTFT is the time from submit
  to the first token (max_tokens 1, so it is the prefill and one sample). Each repeat uses a
  new system prompt, so every cold run is cold; the medians are compared.
- KV per request: the bytes of KV blocks one request holds at a context of T tokens, from
  the engine's own block manager, with sliding-window KV off (every layer keeps every
  position) and on.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from dataclasses import dataclass

from heads.engine.block_manager import BlockManager
from heads.engine.config import EngineConfig
from heads.engine.llm_engine import LocalEngine
from heads.engine.sequence import Sequence
from heads.engine.types import GenerationRequest
from heads.model.weights import Checkpoint
from kernels.row_params import RowParams

log = logging.getLogger(__name__)

WARM_TARGET = 0.3  # warm TTFT <= 0.3 x cold
KV_TARGET = 0.35  # KV per request at 4k with sliding-window KV <= 0.35 x without


@dataclass(frozen=True, slots=True)
class PrefixRow:
    head: str
    prefix_tokens: int
    suffix_tokens: int
    cold_ttft_ms: float  # median over repeats
    warm_ttft_ms: float
    cached_tokens: int  # what the warm request reported

    @property
    def ratio(self) -> float:
        return self.warm_ttft_ms / self.cold_ttft_ms


@dataclass(frozen=True, slots=True)
class KVRow:
    context: int
    full_bytes: int  # sliding-window KV off
    sliding_bytes: int  # on
    sliding_layers: int  # 0: nothing to trim (the ratio is 1 by construction)

    @property
    def ratio(self) -> float:
        return self.sliding_bytes / self.full_bytes


def prefix_ttft(ckpt: Checkpoint, head: str, prefix_tokens: int = 1536, suffix_tokens: int = 16,
                repeats: int = 3) -> PrefixRow:
    spec = ckpt.model.heads[head]
    limit = ckpt.manifest.backbone.max_position_embeddings
    prefix_tokens = min(prefix_tokens, limit - suffix_tokens - 2)
    cfg = EngineConfig(num_kv_blocks=2 * (-(-(prefix_tokens + suffix_tokens + 2) // 16)) + 8,
                       max_num_batched_tokens=prefix_tokens + suffix_tokens + 2)
    engine = LocalEngine(ckpt.model, cfg)
    vocab = spec.vocab_size
    greedy = RowParams(temperature=0.0)

    async def ttft(rid: str, ids: list[int]) -> tuple[float, int]:
        req = GenerationRequest(rid, head, tuple(ids), 1, greedy, frozenset())
        t0 = time.perf_counter()
        events = [e async for e in engine.generate(req)]
        return time.perf_counter() - t0, events[0].cached_tokens or 0

    async def main() -> tuple[list[float], list[float], int]:
        await engine.start()
        try:
            cold, warm, cached = [], [], 0
            await ttft("warm-up", [(7 * i) % vocab for i in range(64)])
            for r in range(repeats):
                # Token ids spread over the vocabulary; a new first token per repeat keeps
                # every system prompt unseen (the hash chain starts there).
                system = [(r * 7919 + 31 * i + 11) % vocab for i in range(prefix_tokens)]
                user = [[(13 * i + k * 101 + 5) % vocab for i in range(suffix_tokens)]
                        for k in range(2)]
                t_cold, _ = await ttft(f"cold{r}", system + user[0])
                t_warm, cached = await ttft(f"warm{r}", system + user[1])
                cold.append(t_cold)
                warm.append(t_warm)
            return cold, warm, cached
        finally:
            await engine.shutdown()

    cold, warm, cached = asyncio.run(main())
    row = PrefixRow(head, prefix_tokens, suffix_tokens, 1000 * statistics.median(cold),
                    1000 * statistics.median(warm), cached)
    log.info("prefix cache %s: cold %.1f ms, warm %.1f ms (%.2fx), %d cached", head,
             row.cold_ttft_ms, row.warm_ttft_ms, row.ratio, cached)
    return row


def kv_per_request(ckpt: Checkpoint, contexts: tuple[int, ...] = (1024, 4096),
                   block_size: int = 16) -> list[KVRow]:
    backbone = ckpt.manifest.backbone
    dtype = ckpt.model.dtype_name
    rows = []
    for n in contexts:
        held = []
        for sliding in (False, True):
            cfg = EngineConfig(block_size=block_size, sliding_window_kv=sliding,
                               num_kv_blocks=-(-n // block_size) + 1)
            layout = cfg.layout(backbone)
            bm = BlockManager(cfg.num_blocks(backbone, dtype), block_size, False, layout)
            seq = Sequence("kv", "-", list(range(n)), RowParams(temperature=0.0), max_tokens=1)
            bm.allocate(seq)
            unit = cfg.kv_block_bytes(backbone, dtype) * layout.group_size // backbone.num_layers
            held.append((bm.num_blocks - bm.num_free) * unit)
        types = backbone.layer_types
        rows.append(KVRow(n, held[0], held[1], sum(t == "sliding_attention" for t in types)))
    return rows


def prefix_table(rows: list[PrefixRow]) -> str:
    lines = [f"{'head':<7}{'prefix':>7}{'suffix':>7}{'cold ms':>10}{'warm ms':>10}"
             f"{'warm/cold':>10}{'cached':>8}  target <= {WARM_TARGET}x"]
    for r in rows:
        verdict = "MET" if r.ratio <= WARM_TARGET else "MISSED"
        lines.append(f"{r.head:<7}{r.prefix_tokens:>7}{r.suffix_tokens:>7}{r.cold_ttft_ms:>10.1f}"
                     f"{r.warm_ttft_ms:>10.1f}{r.ratio:>9.2f}x{r.cached_tokens:>8}  {verdict}")
    return "\n".join(lines)


def kv_table(rows: list[KVRow]) -> str:
    lines = [f"{'context':>8}{'full KV MiB':>13}{'sliding KV MiB':>16}{'ratio':>8}"
             f"  target at 4096 <= {KV_TARGET}x"]
    for r in rows:
        verdict = ("MET" if r.ratio <= KV_TARGET else "MISSED") if r.context == 4096 else ""
        if not r.sliding_layers:
            verdict = "n/a: no sliding-window layers"
        lines.append(f"{r.context:>8}{r.full_bytes / 2**20:>13.2f}{r.sliding_bytes / 2**20:>16.2f}"
                     f"{r.ratio:>7.2f}x  {verdict}")
    return "\n".join(lines)

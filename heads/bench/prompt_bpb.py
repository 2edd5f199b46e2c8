"""What live prompt BPB costs in prefill, and what it reads on prose, code and random bytes.

`python -m heads.bench.prompt_bpb MODEL_DIR` runs one ~200-500-token prompt per type through
the local engine with max_tokens=1 (one step: the prefill) per head, with scoring off,
sampled (k positions) and exact, interleaved over repeats; prints a table and writes JSON.
Overhead = the engine's measured scoring time ÷ the unscored prefill step of the same run
(medians). bpb_k=N is one draw of the sampled estimate. Never asserts speed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
from pathlib import Path

from heads.data.files import PROMPT_BPB_PROMPTS
from heads.engine.config import EngineConfig
from heads.engine.llm_engine import LocalEngine
from heads.engine.types import GenerationRequest
from heads.model.weights import Checkpoint, load_checkpoint
from kernels.row_params import RowParams

PROMPTS_FILE = PROMPT_BPB_PROMPTS


def prompts() -> dict[str, str]:
    """The prose, code and random-byte prompts, by type (heads/data/README.md says whence)."""
    return json.loads(PROMPTS_FILE.read_text(encoding="utf-8"))


def encode(ckpt: Checkpoint, head: str, text: str) -> list[int]:
    ids = ckpt.tokenizers[head].encode(text)
    bos = ckpt.manifest.head(head).bos_token_id
    return ids if bos is None else [bos, *ids]


async def _prefill(engine: LocalEngine, head: str, ids: list[int], score: bool,
                   positions: int, rid: str) -> tuple[float, float, float | None]:
    """-> (prefill step s, of which scoring s, prompt NLL nats or None)."""
    req = GenerationRequest(rid, head, tuple(ids), 1, RowParams(temperature=0.0, seed=1),
                            frozenset(), False, score, positions)
    engine.drain_step_timings()
    before = engine.prompt_score_seconds()
    events = [e async for e in engine.generate(req)]  # max_tokens=1: the prefill step only
    step = sum(t.seconds for t in engine.drain_step_timings() if t.prefill)
    first = events[0].prompt_score
    return step, engine.prompt_score_seconds() - before, first.nll_nats if first else None


async def run(ckpt: Checkpoint, repeats: int, positions: list[int]) -> list[dict]:
    engine = LocalEngine(ckpt.model, EngineConfig(kv_cache_bytes=64 << 20))
    await engine.start()
    modes = [("off", False, 0), *((f"k={k}", True, k) for k in positions), ("exact", True, 0)]
    rows = []
    try:
        for kind, text in prompts().items():
            for head in ckpt.manifest.head_names:
                ids = encode(ckpt, head, text)
                step: dict[str, list[float]] = {m: [] for m, _, _ in modes}
                scoring: dict[str, list[float]] = {m: [] for m, _, _ in modes}
                nll: dict[str, float | None] = {}
                await _prefill(engine, head, ids, True, 0, "warm")
                for r in range(repeats):
                    for m, score, k in modes:  # interleaved: load drift hits every mode alike
                        st, sc, nll[m] = await _prefill(engine, head, ids, score, k, f"{m}-{r}")
                        step[m].append(st)
                        scoring[m].append(sc)
                base = statistics.median(step["off"])  # the prefill step without scoring
                n_bytes = len(text.encode())
                rows.append({
                    "prompt": kind, "head": head, "tokens": len(ids), "bytes": n_bytes,
                    "prefill_s": base,
                    # scoring time ÷ the unscored prefill step, both measured in this run
                    **{f"overhead_{m}": statistics.median(scoring[m]) / base
                       for m, _, _ in modes[1:]},
                    "bpb_exact": nll["exact"] / math.log(2) / n_bytes,  # type: ignore[operator]
                    **{f"bpb_{m}": nll[m] / math.log(2) / n_bytes  # type: ignore[operator]
                       for m, _, _ in modes[1:-1]},
                })
    finally:
        await engine.shutdown()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--positions", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--out", type=Path, default=Path("prompt_bpb_bench.json"))
    a = ap.parse_args()
    ckpt = load_checkpoint(a.model_dir, compute_dtype="float32")
    rows = asyncio.run(run(ckpt, a.repeats, a.positions))
    a.out.write_text(json.dumps(rows, indent=2))
    cols = [c for c in rows[0] if c not in ("bytes",)]
    print(" | ".join(cols))  # noqa: T201 (CLI output)
    for row in rows:
        print(" | ".join(f"{row[c]:.3f}" if isinstance(row[c], float) else str(row[c])  # noqa: T201
                         for c in cols))


if __name__ == "__main__":
    main()

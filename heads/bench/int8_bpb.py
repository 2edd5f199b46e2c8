"""What reading the model file's integer groups costs in quality: BPB per head and sample, the
engine on `weights=quantized` (every product on integer groups, activations quantised per group
of 32 to int16) against `weights=bf16` (the dequantised bf16 build), on the committed
per-language samples and the held-out wiki sample.

`python -m heads.bench.int8_bpb MODEL_DIR` runs each policy in its own process (the packed
products belong to the model, one policy per process), scores each sample's first
`--max-bytes` bytes exactly through the engine's prompt scoring (one prefill, every position),
and prints the table with the target (quantised <= 1.003x bf16 on every row) MET or MISSED.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import subprocess
import sys
from pathlib import Path

from heads.bench.prompt_bpb import encode
from heads.data.files import DATA_DIR, WIKI_SAMPLE_B
from heads.engine.config import EngineConfig
from heads.engine.llm_engine import LocalEngine
from heads.engine.types import GenerationRequest
from heads.model.weights import load_checkpoint
from kernels.row_params import RowParams

TARGET = 1.003  # quantised BPB / bf16 BPB, at most, on every (head, sample)
SAMPLES = {"wiki-heldout": WIKI_SAMPLE_B,
           **{p.stem: p for p in sorted((DATA_DIR / "multilingual").glob("*.txt"))}}


def _text(path: Path, max_bytes: int) -> str:
    return path.read_bytes()[:max_bytes].decode("utf-8", "ignore")


async def _scores(model_dir: Path, weights: str, max_bytes: int) -> dict[str, float]:
    """"head/sample" -> BPB under `weights`."""
    ckpt = load_checkpoint(model_dir, int8=weights != "bf16")
    engine = LocalEngine(ckpt.model, EngineConfig(kv_cache_bytes=128 << 20,
                                                  max_num_batched_tokens=2048, weights=weights))
    await engine.start()
    out = {}
    try:
        for head in ckpt.manifest.head_names:
            for name, path in SAMPLES.items():
                text = _text(path, max_bytes)
                req = GenerationRequest(f"{head}-{name}", head, tuple(encode(ckpt, head, text)),
                                        1, RowParams(temperature=0.0, seed=1), frozenset(),
                                        False, True, 0)
                first = [e async for e in engine.generate(req)][0].prompt_score
                assert first is not None
                out[f"{head}/{name}"] = first.nll_nats / math.log(2) / len(text.encode())
    finally:
        await engine.shutdown()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--max-bytes", type=int, default=1500)
    ap.add_argument("--weights", choices=["bf16", "quantized"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.weights:  # one policy, in this process: print its scores as JSON
        print(json.dumps(asyncio.run(_scores(a.model_dir, a.weights, a.max_bytes))))  # noqa: T201
        return
    runs = {}
    for weights in ("bf16", "quantized"):
        proc = subprocess.run([sys.executable, "-m", "heads.bench.int8_bpb", str(a.model_dir),
                               "--max-bytes", str(a.max_bytes), "--weights", weights],
                              check=True, capture_output=True, text=True)
        runs[weights] = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"{'head/sample':<22}{'bf16 BPB':>10}{'int8 BPB':>10}{'ratio':>8}")  # noqa: T201
    worst = 0.0
    for key, bf16 in runs["bf16"].items():
        q = runs["quantized"][key]
        worst = max(worst, q / bf16)
        print(f"{key:<22}{bf16:>10.4f}{q:>10.4f}{q / bf16:>8.4f}")  # noqa: T201
    verdict = "MET" if worst <= TARGET else "MISSED"
    print(f"target int8 BPB <= {TARGET}x bf16 on every head and sample: {verdict} "  # noqa: T201
          f"(worst {worst:.4f}x)")


if __name__ == "__main__":
    main()

"""Encode throughput of each head's tokenizer against the native one, in one run.

A boundary-preserving head encodes with the native tokenizer and then re-spells removed
ids through its split table, so its cost is the native encode plus a vectorised expansion;
a merge-filtered head runs its own (smaller) BPE. Each text is encoded through the batch
path the gateway uses (`HeadTokenizer.encode_batch`, Rust without the GIL), heads
interleaved over repeats; the figure is the median. Never asserts speed.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from heads.checkpoint import load_metadata


@dataclass(frozen=True, slots=True)
class EncodeRow:
    checkpoint: str
    head: str
    trim: str  # "split", "merges" or "native"
    bytes: int
    tokens: int
    seconds: float  # median of the repeats

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e6

    def row(self, native_mb_per_s: float) -> dict:
        return {"checkpoint": self.checkpoint, "head": self.head, "trim": self.trim,
                "bytes": self.bytes, "tokens": self.tokens, "seconds": self.seconds,
                "mb_per_s": round(self.mb_per_s, 3),
                "vs_native": round(self.mb_per_s / native_mb_per_s, 3)}


def texts_of(files: list[Path], max_bytes: int, piece_bytes: int = 2048) -> list[str]:
    """Each file's first `max_bytes`, in pieces of about `piece_bytes` (request-sized)."""
    out = []
    for path in files:
        text = path.read_bytes()[:max_bytes].decode("utf-8", errors="ignore")
        out += [text[i:i + piece_bytes] for i in range(0, len(text), piece_bytes)]
    return out


def measure(checkpoints: list[Path], texts: list[str], repeats: int) -> list[EncodeRow]:
    heads = []
    for ckpt in checkpoints:
        manifest, toks = load_metadata(ckpt)
        native = max(manifest.heads, key=lambda h: h.vocab_size).name
        for h in manifest.heads:
            trim = ("native" if h.name == native
                    else "split" if toks[h.name].split is not None else "merges")
            heads.append((ckpt.name, h.name, trim, toks[h.name]))
    size = sum(len(t.encode()) for t in texts)
    times: dict[int, list[float]] = {i: [] for i in range(len(heads))}
    counts: dict[int, int] = {}
    for _ in range(repeats):
        for i, (_, _, _, tok) in enumerate(heads):
            t0 = time.perf_counter()
            ids = tok.encode_batch(texts)
            times[i].append(time.perf_counter() - t0)
            counts[i] = sum(len(x) for x in ids)
    return [EncodeRow(c, h, trim, size, counts[i], statistics.median(times[i]))
            for i, (c, h, trim, _) in enumerate(heads)]

"""polyhead bench tokenize: encode MB/s of every head against its checkpoint's native head."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register_bench(bsub: argparse._SubParsersAction) -> None:
    p = bsub.add_parser("tokenize", help="encode throughput per head, relative to native")
    p.add_argument("checkpoints", type=Path, nargs="+", metavar="DIR",
                   help="checkpoints to compare (e.g. a split build and a merges build)")
    p.add_argument("--corpus", type=Path, nargs="+", required=True, metavar="FILE",
                   help="text files to encode (e.g. corpus *.heldout.txt)")
    p.add_argument("--max-bytes", type=int, default=500_000, help="bytes read per file")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, default=Path("bench-out"))
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from heads.bench.tokenizers_speed import measure, texts_of

    texts = texts_of(args.corpus, args.max_bytes)
    rows = measure(args.checkpoints, texts, args.repeats)
    native = {r.checkpoint: r.mb_per_s for r in rows if r.trim == "native"}
    out = [r.row(native[r.checkpoint]) for r in rows]
    print(f"{len(texts)} texts, {rows[0].bytes:,} bytes, median of {args.repeats}")
    print(f"{'checkpoint':<16}{'head':<7}{'trim':<8}{'MB/s':>8}{'vs native':>11}"
          f"{'bytes/tok':>11}")
    for r, o in zip(rows, out, strict=True):
        print(f"{r.checkpoint:<16}{r.head:<7}{r.trim:<8}{r.mb_per_s:>8.2f}"
              f"{o['vs_native']:>11.3f}{r.bytes / r.tokens:>11.3f}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tokenize.json").write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out / 'tokenize.json'}")

"""polyhead corpus ...: assemble the calibration / evaluation corpus."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    corpus = sub.add_parser("corpus", help="assemble the English calibration corpus")
    csub = corpus.add_subparsers(dest="corpus_command", required=True, metavar="CORPUS_COMMAND")
    build = csub.add_parser(
        "build", help="download the pinned sources (or read --files) and write train/held-out "
        "splits per source")
    build.add_argument("--out", type=Path,
                       help="output directory (default $POLYHEAD_CACHE_DIR/corpus, "
                       "~/.cache/polyhead/corpus)")
    build.add_argument("--files", type=Path, nargs="+", metavar="FILE",
                       help="use these text files (one source each) instead of the pinned ones")
    build.set_defaults(run=_corpus_build)


def _corpus_build(args: argparse.Namespace) -> None:
    from heads.corpus import build_corpus, default_corpus_dir
    from server.logging_setup import configure_logging

    configure_logging("text", "INFO")
    out = args.out or default_corpus_dir()
    summaries = build_corpus(out, args.files)
    print(f"{'source':<12}{'docs':>9}{'train MB':>10}{'heldout MB':>12}  origin")
    for s in summaries:
        print(f"{s.name:<12}{sum(s.documents.values()):>9}{s.bytes['train'] / 1e6:>10.2f}"
              f"{s.bytes['heldout'] / 1e6:>12.2f}  {s.origin}")
    print(f"wrote {out}")

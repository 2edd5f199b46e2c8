"""polyhead heads ...: inspect checkpoints and their heads."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    heads = sub.add_parser("heads", help="inspect checkpoints and their heads")
    hsub = heads.add_subparsers(dest="heads_command", required=True, metavar="HEADS_COMMAND")
    inspect = hsub.add_parser("inspect", help="validate a checkpoint and list its heads")
    inspect.add_argument("dir", type=Path, help="checkpoint directory")
    inspect.set_defaults(run=_heads_inspect)


def _heads_inspect(args: argparse.Namespace) -> None:
    from heads.checkpoint import describe_checkpoint

    print(describe_checkpoint(args.dir))

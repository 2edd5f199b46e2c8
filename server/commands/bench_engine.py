"""polyhead bench engine: decode speed per head, local engine vs transformers (and vLLM)."""

from __future__ import annotations

import argparse
from pathlib import Path


def _ints(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers: {text!r}") from None


def register_bench(bsub: argparse._SubParsersAction) -> None:
    p = bsub.add_parser("engine", help="decode tok/s and ms/step per head and engine")
    p.add_argument("--model", type=Path,
                   help="checkpoint directory (default: the tiny model, built if missing)")
    p.add_argument("--batches", type=_ints, default=[1, 4, 16, 64], help="e.g. 1,4,16,64")
    p.add_argument("--tokens", type=int, default=64, help="new tokens per request (>= 2)")
    p.add_argument("--threads", type=int, default=1, help="torch threads for every engine")
    p.add_argument("--backends", default="local,transformers,vllm",
                   help="comma-separated: local, transformers, vllm")
    p.add_argument("--heads", help="comma-separated head names (default: all)")
    p.add_argument("--repeats", type=int, default=1, help="best of this many timed runs")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "stored"], default="float32",
                   help="compute dtype for every engine (default float32: fastest on CPU)")
    p.add_argument("--out", type=Path, default=Path("bench-results"),
                   help="directory for bench_engine.json and .png")
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> None:
    from heads.bench_engine import bench, table, write
    from server.commands.errors import CliError
    from server.logging_setup import configure_logging

    configure_logging("text", "INFO")
    engines = [e.strip() for e in args.backends.split(",") if e.strip()]
    unknown = set(engines) - {"local", "transformers", "vllm"}
    if unknown or args.tokens < 2 or not args.batches or min(args.batches) < 1:
        raise CliError(f"bad arguments: engines {sorted(unknown)}, --tokens >= 2, batches >= 1")
    model = args.model
    if model is None:
        from server.model_source import resolve_model_dir
        from server.settings import load_settings

        model = resolve_model_dir("gemma3-270m", load_settings(None).cache_dir)
    heads = [h for h in (args.heads or "").split(",") if h]
    rows = bench(model, args.batches, args.tokens, args.threads, engines, args.repeats, heads,
                 None if args.dtype == "stored" else args.dtype)
    print(table(rows))
    js, png = write(rows, args.out)
    print(f"wrote {js} and {png}")

"""polyhead bench chat: first answers to 20 fixed chat prompts, per chat format."""

from __future__ import annotations

import argparse
from pathlib import Path


def register_bench(bsub: argparse._SubParsersAction) -> None:
    p = bsub.add_parser("chat", help="first chat answers to fixed prompts, per chat format")
    p.add_argument("--model", default="gemma3-270m",
                   help="built-in name or checkpoint directory (ignored with --url)")
    p.add_argument("--url", help="a running gateway to ask instead of starting one")
    p.add_argument("--label", default="url", help="the name of the --url run in the output")
    p.add_argument("--formats", default="plain,gemma,auto",
                   help="comma-separated chat formats, one gateway each: auto, model, qa, "
                        "gemma, plain")
    p.add_argument("--backend", default="local", help="the started gateways' backend")
    p.add_argument("--max-tokens", type=int, default=48, help="cap on each reply")
    p.add_argument("--prompts", type=Path, help="prompt file (default: the committed 20)")
    p.add_argument("--out", type=Path, default=Path("bench-results"))
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> None:
    import tempfile

    from server.bench.chat import load_prompts, run_prompts, table, target, write
    from server.bench.gateway import free_port, gateway
    from server.model_source import resolve_model_dir
    from server.settings import load_settings

    prompts = load_prompts(args.prompts)
    runs = {}
    if args.url:
        runs[args.label] = run_prompts(args.url.rstrip("/"), prompts, args.max_tokens)
    else:
        model = str(resolve_model_dir(args.model, load_settings(None).cache_dir))
        logs = Path(tempfile.mkdtemp(prefix="polyhead-bench-chat-"))
        for fmt in (f.strip() for f in args.formats.split(",") if f.strip()):
            # A fresh λ store per run: served bytes from earlier runs would move the routing.
            with gateway(model, free_port(), logs / f"{fmt}.log", POLYHEAD_CHAT_FORMAT=fmt,
                         POLYHEAD_BACKEND=args.backend,
                         POLYHEAD_LAMBDA_STORE=str(logs / f"{fmt}-lambda.json")) as url:
                runs[fmt] = run_prompts(url, prompts, args.max_tokens)
    for label, answers in runs.items():
        print(table(label, answers))
    for label, answers in runs.items():
        print(target(label, answers))
    print(f"wrote {write(runs, args.out)}")

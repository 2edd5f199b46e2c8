"""polyhead bench gateway: the gateway's added latency, max req/s and held SSE streams."""

from __future__ import annotations

import argparse
from pathlib import Path


def register_bench(bsub: argparse._SubParsersAction) -> None:
    p = bsub.add_parser("gateway", help="added latency p50/p99, max req/s, concurrent streams")
    p.add_argument("--model", help="checkpoint directory (default: the tiny model)")
    p.add_argument("--rps", type=float, default=200, help="open-loop rate for the latency run")
    p.add_argument("--seconds", type=float, default=10, help="length of each timed run")
    p.add_argument("--concurrency", type=int, default=32, help="closed-loop clients")
    p.add_argument("--workers", type=int, default=2,
                   help="uvicorn workers of the extra echo max-rps run (0 or 1 skips it)")
    p.add_argument("--streams", type=int, default=1000, help="concurrent SSE streams to hold")
    p.add_argument("--local-rps", type=float, default=20,
                   help="open-loop rate against the local engine")
    p.add_argument("--backends", default="echo,local", help="comma-separated: echo, local")
    p.add_argument("--features-model", default="gemma3-270m",
                   help="model whose heads tokenize the 2 KB prompt of the features phase "
                        "(built-in name or checkpoint directory); 'none' skips the phase")
    p.add_argument("--features-rps", type=float, default=50,
                   help="open-loop rate of the features phase")
    p.add_argument("--prompt-bytes", type=int, default=0,
                   help="prompt of the latency and max-rps phases (floor included): the first "
                        "N bytes of a committed Wikipedia sample; 0: the short 'bench' prompt")
    p.add_argument("--out", type=Path, default=Path("bench-results"))
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> None:
    import asyncio
    import tempfile

    from heads.checkpoint import load_metadata
    from server.bench.gateway import (
        closed_loop,
        features_summary,
        floor,
        free_port,
        gateway,
        gateway_process,
        hold_streams,
        machine,
        open_loop,
        request_body,
        summary,
        table,
        targets,
        write,
    )
    from server.model_source import resolve_model_dir
    from server.settings import load_settings

    cache = load_settings(None).cache_dir
    model = str(resolve_model_dir(args.model or "tiny", cache))
    body = request_body(load_metadata(Path(model))[0].model_name, args.prompt_bytes)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    rows = []
    logs = Path(tempfile.mkdtemp(prefix="polyhead-bench-"))
    if "echo" in backends:  # the framework floor, same phases, same run
        port = free_port()
        with floor(port, logs / "floor.log") as srv:
            rows.append(asyncio.run(open_loop(srv.url, "floor", args.rps, args.seconds, body)))
            rows.append(asyncio.run(closed_loop(srv.url, "floor", args.concurrency, args.seconds,
                                                srv.pid, body)))
    for backend in backends:
        rps = args.rps if backend == "echo" else args.local_rps
        with gateway_process(model, free_port(), logs / f"{backend}.log",
                             POLYHEAD_BACKEND=backend, POLYHEAD_TORCH_THREADS="1") as srv:
            rows.append(asyncio.run(open_loop(srv.url, backend, rps, args.seconds, body)))
            rows.append(asyncio.run(closed_loop(srv.url, backend, args.concurrency,
                                                args.seconds, srv.pid, body)))
    if "echo" in backends and args.workers > 1:
        with gateway_process(model, free_port(), logs / "echo-workers.log",
                             POLYHEAD_BACKEND="echo", POLYHEAD_TORCH_THREADS="1",
                             POLYHEAD_WORKERS=str(args.workers)) as srv:
            rows.append(asyncio.run(closed_loop(srv.url, f"echo/{args.workers}w",
                                                args.concurrency, args.seconds, srv.pid, body)))
    if "echo" in backends and args.streams:
        with gateway(model, free_port(), logs / "streams.log", POLYHEAD_BACKEND="echo",
                     POLYHEAD_ECHO_TOKEN_DELAY_S="0.01") as url:
            rows.append(asyncio.run(hold_streams(url, args.streams, tokens=300)))
    encode_ms = None
    if args.features_model != "none":
        encode_ms = _features(args, rows, logs)
    print(f"machine: {machine()}")
    print(table(rows))
    print(summary(rows))
    print(features_summary(rows, encode_ms))
    for line in targets(rows, "" if args.workers == 2 else f"--workers {args.workers}",
                        args.prompt_bytes):
        print(line)
    print(f"wrote {write(rows, args.out)}; gateway logs in {logs}")


def _features(args: argparse.Namespace, rows: list, logs: Path) -> float:
    """The features phase: one echo gateway per policy mode, same 2 KB prompt, same rate."""
    import asyncio

    from heads.checkpoint import load_metadata
    from heads.data.files import WIKI_SAMPLE_B
    from server.bench.gateway import (
        FEATURES,
        Result,
        encode_p50_ms,
        features_policy,
        free_port,
        gateway,
        open_loop,
    )
    from server.model_source import resolve_model_dir
    from server.settings import load_settings

    model_dir = resolve_model_dir(args.features_model, load_settings(None).cache_dir)
    name = load_metadata(model_dir)[0].model_name
    raw = WIKI_SAMPLE_B.read_bytes()[:2048]
    text = raw.decode("utf-8", "ignore")  # a cut multi-byte character is dropped
    body = {"model": name, "prompt": text, "max_tokens": 1, "temperature": 0}
    for features in FEATURES:
        with gateway(str(model_dir), free_port(), logs / f"features-{features}.log",
                     POLYHEAD_BACKEND="echo", POLYHEAD_TORCH_THREADS="1",
                     POLYHEAD_POLICY=features_policy(features)) as url:
            r: Result = asyncio.run(open_loop(url, f"echo/{features}", args.features_rps,
                                              args.seconds, body, "2KB prompt"))
            rows.append(r)
    return encode_p50_ms(model_dir, text)

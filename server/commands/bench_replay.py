"""polyhead bench replay: a short arrival trace through the real router and the real local
engine, for each policy and each static head, next to the simulator's prediction."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from pathlib import Path

log = logging.getLogger(__name__)


def register_bench(bsub: argparse._SubParsersAction) -> None:
    p = bsub.add_parser("replay", help="replay a trace on the real local engine vs the simulator")
    p.add_argument("--model", default="gemma3-270m",
                   help="checkpoint directory, or a built-in: gemma3-270m (default), tiny")
    p.add_argument("--trace", default="cpu-day", help="a CSV/JSONL file, or a synthetic trace "
                   "name (cpu-day: night / busy noon / night, split into regimes low / high; "
                   "multilingual: cpu-day arrivals, half English and half nine other "
                   "languages; english: the same arrivals, all English; mixed: the same "
                   "arrivals, 35%% English prose, 25%% Python source, 15%% technical "
                   "documentation, 25%% thirteen other languages)")
    p.add_argument("--duration", type=float, default=150.0, help="synthetic trace length, s")
    p.add_argument("--peak", type=float, default=2.0, help="cpu-day: noon arrivals per s")
    p.add_argument("--policies", default=None,
                   help="comma-separated policies; `<policy>:blind` judges requests by the "
                        "manifest's averages only (default: lifecycle,cost; for the "
                        "multilingual and english traces lifecycle,lifecycle:blind)")
    p.add_argument("--calibration", type=Path, default=None, metavar="FILE",
                   help="step samples from `bench engine --calibration-out`: seed the router's "
                        "and the simulator's step times (default: analytic floors)")
    p.add_argument("--lambda", dest="lam", type=float, default=100.0, help="forecast λ")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--max-num-seqs", type=int, default=32, help="engine batch cap")
    p.add_argument("--out", type=Path, default=Path("bench-results"),
                   help="directory for bench_replay.csv")
    p.add_argument("--rounds", type=int, default=1,
                   help="replay every policy/head this many times, interleaved; median kept")
    p.add_argument("--levels", default=None, metavar="CLIENTS",
                   help="load levels, comma-separated numbers of requests kept in flight, "
                   "e.g. 1,4,16: each replays the same --requests requests closed loop and is "
                   "judged apart (named by its measured mean running batch); plots per level")
    p.add_argument("--requests", type=int, default=200,
                   help="with --levels: requests per label and level (default 200)")
    p.add_argument("--statics", default=None, metavar="HEADS",
                   help="with --levels: the static heads to run, e.g. 131k,262k (default all)")
    p.add_argument("--grouped-heads", default="auto", metavar="HEADS",
                   help="split heads (e.g. 32k) whose two-level readings (<head>+groups) are "
                        "served too, as the gateway's grouped_heads setting does (default "
                        "auto: every split head's, as `serve` does; '' for none)")
    p.add_argument("--stock-vllm", action="store_true",
                   help="with --levels: also replay on stock vLLM at its defaults serving the "
                        "native head and the second largest head (their `export vllm "
                        "--per-head` directories, each in vLLM's own server), compared on "
                        "wall seconds in flight per output MB")
    p.add_argument("--score-stride", type=int, default=1, metavar="K",
                   help="with --levels: score served BPB on every K-th request (default 1)")
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> None:
    import torch

    from heads.engine.cpu_linear import auto_compute_dtype
    from heads.model.weights import load_checkpoint
    from router.simulate.traces import TEXT_TRACES, TRACES, day_phases, load_trace, phase_at
    from server.bench.replay.report import (
        language_table,
        language_targets,
        predictor_error,
        quality_table,
        regime_table,
        table,
        targets,
        write_csv,
    )
    from server.bench.replay.runner import ReplayConfig
    from server.bench.replay.session import replay_all
    from server.commands.errors import CliError
    from server.model_source import resolve_model_dir
    from server.ops.logging_setup import configure_logging
    from server.settings import load_settings

    configure_logging("text", "INFO")
    languages = args.trace in TEXT_TRACES
    default = "lifecycle,lifecycle:blind" if languages else "lifecycle,cost"
    policies = [p.strip() for p in (args.policies or default).split(",") if p.strip()]
    if not policies or args.duration <= 0 or args.threads < 1 or args.rounds < 1:
        raise CliError("need at least one policy, --duration > 0, --threads >= 1, --rounds >= 1")
    if args.trace == "cpu-day" or args.trace in TEXT_TRACES:
        trace = TRACES[args.trace](args.duration, peak=args.peak)
        phases = day_phases(args.duration, peak=args.peak)
    elif args.trace in TRACES:
        trace, phases = TRACES[args.trace](args.duration), None
    else:
        trace, phases = load_trace(Path(args.trace)), None
    torch.set_num_threads(args.threads)
    ckpt = load_checkpoint(resolve_model_dir(args.model, load_settings(None).cache_dir),
                           compute_dtype=auto_compute_dtype())  # what `serve` runs
    ckpt = ckpt.with_readings(sorted(ckpt.manifest.readings.values())
                              if args.grouped_heads == "auto"
                              else [h for h in args.grouped_heads.split(",") if h])
    if args.levels is not None:
        _run_levels(args, ckpt, policies, languages)
        return
    regime_of = (lambda t: phase_at(phases, t).regime) if phases else (lambda t: "all")
    cfg = ReplayConfig(max_num_seqs=args.max_num_seqs, lambda_forecast=args.lam)
    print(f"replaying {len(trace)} requests over {trace[-1].arrival_s:.0f} s on "
          f"{ckpt.manifest.model_name} ({args.threads} threads, {ckpt.model.dtype_name}) for "
          f"{', '.join(policies)} and every static head; this takes a few minutes per run")
    rows = asyncio.run(replay_all(ckpt, trace, policies, cfg, regime_of, args.calibration,
                                  args.rounds))
    print(table(rows))
    print("\nmeasured cost per regime (steps stamped with trace time):")
    print(regime_table(rows))
    print("\nserved quality (BPB of each request's held-out continuation, serving head):")
    print(quality_table(rows))
    print("\nper language (cost s/MB / served BPB), then where each policy sent it:")
    print(language_table(rows))
    aware = next(p for p in policies if not p.endswith(":blind"))
    err = predictor_error(next(r.real for r in rows if r.policy == aware))
    if err:
        print(f"\noutput bytes/token predictor, {aware}, mean absolute relative error over "
              f"{err['requests']:.0f} requests: router {err['router']:.3f}, prompt alone "
              f"{err['prompt only']:.3f}")
    print(f"\ntargets (measured; median of {args.rounds} interleaved round(s)):")
    if languages:
        largest = "static:" + ckpt.manifest.native.name
        blind = next((p for p in policies if p.endswith(":blind")), "")
        checks = language_targets(rows, aware, blind, largest, args.trace == "english")
    else:
        checks = targets(rows, policies)
    for name, met, detail in checks:
        print(f"  {'MET' if met else 'MISSED'} {name}: {detail}")
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, args.out / "bench_replay.csv")
    print(f"wrote {args.out / 'bench_replay.csv'}")


def _run_levels(args: argparse.Namespace, ckpt, policies: list[str], languages: bool) -> None:
    from router.simulate.traces import TRACES, SimRequest
    from server.bench.replay.level_run import replay_levels, report
    from server.bench.replay.levels import STOCK_PREFIX
    from server.bench.replay.runner import ReplayConfig
    from server.bench.replay.stock import stock_vllm
    from server.bench.vs_vllm import second_largest
    from server.commands.errors import CliError
    from server.model_source import resolve_model_dir
    from server.settings import load_settings

    try:
        clients = [int(c) for c in args.levels.split(",") if c.strip()]
    except ValueError:
        raise CliError(f"--levels: expected comma-separated integers, got {args.levels!r}") \
            from None
    if args.trace not in TRACES or not clients or min(clients) < 1 or args.requests < 1 \
            or args.score_stride < 1:
        raise CliError("--levels needs a synthetic --trace, clients >= 1, --requests >= 1 "
                       "and --score-stride >= 1")
    heads = [h.name for h in ckpt.manifest.heads]
    statics = heads if args.statics is None else [s.strip() for s in args.statics.split(",")]
    if not set(statics) <= set(heads):
        raise CliError(f"--statics: heads are {', '.join(heads)}")
    largest = ckpt.manifest.native.name
    if largest not in statics:
        statics.append(largest)  # the BPB bounds are relative to it
    duration, trace = args.duration, list[SimRequest]()
    while len(trace) < args.requests:  # the arrivals do not matter closed loop: sizes, languages
        trace = TRACES[args.trace](duration, peak=args.peak)
        duration *= 2
    trace = trace[:args.requests]
    labels = [*policies, *(f"static:{h}" for h in statics)]
    # Stock vLLM at its defaults on the native head's export, then on the second largest
    # head's (what an operator could serve with polyhead's exporter alone).
    stock_heads = [h for h in (largest, second_largest(ckpt.manifest)) if h] \
        if args.stock_vllm else []
    labels += [f"{STOCK_PREFIX}{h}" for h in stock_heads]
    cfg = ReplayConfig(max_num_seqs=args.max_num_seqs, lambda_forecast=args.lam)
    print(f"replaying {len(trace)} {args.trace} requests at {len(clients)} load level(s) "
          f"({', '.join(map(str, clients))} in flight) on {ckpt.manifest.model_name} "
          f"({args.threads} threads, {ckpt.model.dtype_name}), {args.rounds} round(s) of "
          f"{', '.join(labels)}")

    async def replay() -> list:
        if not args.stock_vllm:
            return await replay_levels(ckpt, trace, labels, clients, cfg, args.rounds,
                                       args.calibration, args.score_stride)
        settings = load_settings(None)
        model_dir = resolve_model_dir(args.model, settings.cache_dir)
        args.out.mkdir(parents=True, exist_ok=True)
        async with contextlib.AsyncExitStack() as stack:
            stock = {h: await stack.enter_async_context(stock_vllm(
                model_dir, ckpt.manifest, settings.cache_dir,
                args.out / f"stock-vllm-{h}.log", h)) for h in stock_heads}
            return await replay_levels(ckpt, trace, labels, clients, cfg, args.rounds,
                                       args.calibration, args.score_stride, stock)

    lvls = asyncio.run(replay())
    router = next(p for p in policies if not p.endswith(":blind"))
    second = second_largest(ckpt.manifest)
    text, _ = report(lvls, router, f"static:{largest}", args.trace == "english", args.trace,
                     args.out, f"static:{second}" if second else None)
    print(text)

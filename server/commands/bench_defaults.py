"""polyhead bench defaults: `polyhead serve` at its defaults (the router, and the exact mode
of max_bpb_loss 0) against every head it could pin, on one server, with `vllm bench serve`,
in rounds; prints the targets as MET or MISSED."""

from __future__ import annotations

import argparse
import secrets
from pathlib import Path


def register_bench(bsub: argparse._SubParsersAction) -> None:
    p = bsub.add_parser("defaults", help="polyhead serve's defaults vs the heads it could pin")
    p.add_argument("--model", default="gemma3-270m", help="built-in name or checkpoint dir")
    p.add_argument("--concurrency", default="1,16", help="comma-separated")
    p.add_argument("--prompts", default="mixed,python", help="comma-separated sets")
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2, help="polyhead's torch threads")
    p.add_argument("--labels", default=None,
                   help="comma-separated subset of: router, exact, pinned:<head>")
    p.add_argument("--out", type=Path, default=Path("bench-results/defaults"))
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> None:
    from heads.manifest import Manifest
    from server.bench import defaults as d
    from server.bench.gateway import free_port, gateway
    from server.bench.vs_vllm import bench_serve, logs_dir, native_export, second_largest
    from server.model_source import resolve_model_dir
    from server.settings import load_settings

    settings = load_settings(None)
    model_dir = resolve_model_dir(args.model, settings.cache_dir)
    manifest = Manifest.load(model_dir)
    tokenizer = native_export(model_dir, manifest, settings.cache_dir)  # counts tokens only
    native, second = manifest.native.name, second_largest(manifest) or manifest.native.name
    readings = sorted(f"{h}+groups" for h in manifest.readings.values())
    names = {"native": f"pinned:{native}", "second": f"pinned:{second}"}
    labels = [d.ROUTER, d.EXACT, names["second"], names["native"],
              *(f"pinned:{r}" for r in readings)]
    if args.labels:
        labels = [x.strip() for x in args.labels.split(",") if x.strip()]
    sets = [s.strip() for s in args.prompts.split(",") if s.strip()]
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    token, logs, runs = secrets.token_hex(16), logs_dir(), []
    with gateway(str(model_dir), free_port(), logs / "polyhead.log",
                 POLYHEAD_TORCH_THREADS=str(args.threads), POLYHEAD_ADMIN_TOKEN=token,
                 POLYHEAD_CACHE_DIR=str(logs / "cache")) as url:
        for i in range(1, args.rounds + 1):
            for name in sets:
                for c in levels:
                    n = max(len(d.PROMPT_SETS[name].read_text().splitlines()), c)
                    for label in labels:
                        head = label.partition(":")[2]
                        endpoint = f"/heads/{head}/v1/completions" if head else "/v1/completions"
                        undo = d.exact_policy(url, token) if label == d.EXACT else None
                        try:
                            r = bench_serve(url, manifest.model_name, tokenizer,
                                            d.PROMPT_SETS[name], c, n, args.output_len,
                                            args.out / label.replace(":", "-") / name
                                            / f"round{i}", endpoint)
                        finally:
                            if undo is not None:
                                undo()
                        runs.append(d.run_of(label, name, c, i, r))
    lines = d.verdicts(runs, names)
    print(d.table(runs, labels, names))
    print("\n".join(d.exactness(runs, names["native"])))
    print("\n".join(lines))
    print(f"wrote {d.write(runs, lines, args.out)} (logs in {logs})")

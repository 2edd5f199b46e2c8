"""polyhead bench ...: benchmarks. Each prints a table, writes JSON/CSV and a PNG, and reports
ratios against a baseline measured in the same run. Benchmarks never assert speed.

Each benchmark is a module in server/commands/ with `register_bench(bench_subparsers)`;
list it in BENCHES.
"""

from __future__ import annotations

import argparse

from server.commands import (
    bench_chat,
    bench_defaults,
    bench_engine,
    bench_gateway,
    bench_kernels,
    bench_replay,
    bench_router,
    bench_tokenize,
    bench_vs_vllm,
)

BENCHES: tuple = (bench_chat, bench_defaults, bench_engine, bench_gateway, bench_kernels,
                  bench_router, bench_replay, bench_tokenize, bench_vs_vllm)


def register(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="benchmarks (tables, JSON/CSV, PNG)")
    bsub = bench.add_subparsers(dest="bench_command", required=True, metavar="BENCH")
    for module in BENCHES:
        module.register_bench(bsub)

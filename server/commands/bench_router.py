"""polyhead bench router: in-process latency of one routing decision (target p99 < 50 µs).

Replays a mix of request sizes through Router.decide for each policy, on the paper-class
profile; reports p50/p99/max per policy, relative to the pinned policy (the floor: no cost
model), and writes JSON and a PNG. It never asserts speed.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import time
from pathlib import Path

from kernels.devices import lookup_device
from router.profiles import RequestFeatures
from router.router import Router
from router.simulate.compare import PAPER_HEADS, policy_doc
from router.state import LiveState

log = logging.getLogger(__name__)
POLICIES = ("pinned", "lifecycle", "cost", "threshold", "weighted")


def register_bench(bsub: argparse._SubParsersAction) -> None:
    p = bsub.add_parser("router", help="routing decision latency (µs) per policy")
    p.add_argument("--n", type=int, default=20000, help="decisions per policy")
    p.add_argument("--device", default="a100-80")
    p.add_argument("--out", type=Path, default=Path("bench-out"))
    p.add_argument("--quick", action="store_true", help="1,000 decisions, no PNG")
    p.set_defaults(run=run)


def measure(policy: str, n: int, device: str) -> list[float]:
    profiles = PAPER_HEADS
    state = LiveState.for_profiles(profiles)
    heads = [p.name for p in profiles]
    doc = policy_doc("32k" if policy == "pinned" else policy, heads)
    router = Router(profiles, lookup_device(device), state, doc)
    rng = random.Random(0)
    feats = [RequestFeatures(rng.randint(10, 8000), rng.choice((64, 256, 1024)))
             for _ in range(256)]
    out = []
    for i in range(n):
        if i % 64 == 0:  # the gateway refreshes live load on every request; vary it
            state.set_loads({h: (rng.randint(0, 128), rng.randint(0, 8)) for h in heads})
        t0 = time.perf_counter_ns()
        router.decide(feats[i % len(feats)])
        out.append((time.perf_counter_ns() - t0) / 1000)
    return out


def _q(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def run(args: argparse.Namespace) -> None:
    n = 1000 if args.quick else args.n
    results = {p: measure(p, n, args.device) for p in POLICIES}
    base = _q(results["pinned"], 0.5)
    print(f"{'policy':10} {'p50 µs':>8} {'p99 µs':>8} {'max µs':>8} {'p50 ÷ pinned':>13}")
    table = {}
    for p, xs in results.items():
        row = {"p50_us": _q(xs, 0.5), "p99_us": _q(xs, 0.99), "max_us": max(xs), "n": n}
        table[p] = row
        print(f"{p:10} {row['p50_us']:8.1f} {row['p99_us']:8.1f} {row['max_us']:8.1f} "
              f"{row['p50_us'] / base:13.2f}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench-router.json").write_text(json.dumps(table, indent=2))
    print(f"wrote {args.out / 'bench-router.json'}")
    if not args.quick:
        import matplotlib  # lazily: only the CLI draws

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        ax.boxplot([results[p] for p in POLICIES], tick_labels=list(POLICIES), whis=(1, 99),
                   showfliers=False)
        ax.axhline(50, color="red", lw=0.8, label="50 µs target (p99)")
        ax.set_ylabel("decision latency, µs")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.out / "bench-router.png", dpi=100)
        plt.close(fig)
        print(f"wrote {args.out / 'bench-router.png'}")

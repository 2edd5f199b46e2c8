"""polyhead heads adapt: fit a trimmed head's output adapter, backbone frozen."""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

from heads.adapt.data import DEFAULT_MIX


def _mix(text: str) -> tuple[tuple[str, float], ...]:
    """`wiki=0.4,gcide=0.1` -> ((wiki, 0.4), (gcide, 0.1))."""
    try:
        pairs = [p.split("=") for p in text.split(",") if p.strip()]
        return tuple((name.strip(), float(share)) for name, share in pairs)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected SOURCE=SHARE,...; got {text!r}") from None


def register(hsub: argparse._SubParsersAction) -> None:
    p = hsub.add_parser(
        "adapt", help="fit a trimmed head's output adapter with the backbone frozen")
    p.add_argument("dir", type=Path, help="checkpoint directory")
    p.add_argument("--head", required=True,
                   help="the trimmed head to adapt (not the native), or <head>+groups for a "
                   "split head's two-level reading (its first level, over native context)")
    p.add_argument("--kind", choices=("lowrank", "hidden"), default="hidden",
                   help="hidden (default): bias + h + U D h; lowrank: bias + A B on the "
                   "head's rows")
    p.add_argument("--rank", type=int, default=32,
                   help="r (default 32: 0.3 MB hidden, 4.4 MB low-rank at V=32k)")
    p.add_argument("--steps", type=int, default=300, help="most optimizer steps")
    p.add_argument("--batch", type=int, default=512, help="positions per step")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--kl-weight", type=float, default=1.0,
                   help="weight of the KL to the folded native distribution")
    p.add_argument("--kl-where", choices=("all", "boundary"), default="all",
                   help="KL at every position, or where the target starts a native token")
    p.add_argument("--l2", type=float, default=1e-5, help="weight of Σθ² over the adapter")
    p.add_argument("--eval-every", type=int, default=50, help="steps between held-out BPB")
    p.add_argument("--patience", type=int, default=3,
                   help="evaluations without a new best before stopping early")
    p.add_argument("--corpus-dir", type=Path,
                   default=Path.home() / ".cache" / "polyhead" / "corpus",
                   help="where <source>.train.txt / .heldout.txt are (polyhead corpus build)")
    p.add_argument("--mix", type=_mix, default=DEFAULT_MIX,
                   help="SOURCE=SHARE,... (default " + ",".join(f"{s}={w:g}" for s, w in
                                                                DEFAULT_MIX) + ")")
    p.add_argument("--train-bytes", type=int, default=200_000)
    p.add_argument("--heldout-bytes", type=int, default=40_000)
    p.add_argument("--top-k", type=int, default=32, help="teacher probabilities per position")
    p.add_argument("--cache-dir", type=Path,
                   help="hidden-state/teacher cache and resumable state "
                   "(default ~/.cache/polyhead/adapt)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--out", type=Path, help="write an adapted copy here instead")
    where.add_argument("--in-place", action="store_true", default=True,
                       help="write into DIR (default; atomic)")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    p.add_argument("--refit-penalty", action=argparse.BooleanOptionalAction, default=True,
                   help="refit the router's quality model on the adapted checkpoint when it "
                   "has one (default; evaluates every head on the per-language samples)")
    p.set_defaults(run=_heads_adapt)


def _heads_adapt(args: argparse.Namespace) -> None:
    import torch

    from heads.adapt.data import DataConfig
    from heads.adapt.run import AdaptConfig, adapt
    from heads.adapt.train import TrainConfig
    from heads.manifest import Manifest
    from server.model_source import fit_penalties
    from server.ops.logging_setup import configure_logging

    configure_logging("text", "INFO")
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = AdaptConfig(
        head=args.head,
        data=DataConfig(args.corpus_dir, args.mix, args.train_bytes, args.heldout_bytes),
        train=TrainConfig(kind=args.kind, rank=args.rank, steps=args.steps, batch=args.batch,
                          lr=args.lr, kl_weight=args.kl_weight, kl_where=args.kl_where,
                          l2=args.l2, eval_every=args.eval_every, patience=args.patience),
        top_k=args.top_k, cache_dir=args.cache_dir)
    t0 = time.perf_counter()
    report = adapt(args.dir, cfg, args.out)
    seconds = time.perf_counter() - t0
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    s, r = report.spec, report.result
    print(f"adapted {args.head} ({s.kind}, r={s.rank}) in {report.checkpoint}: {r.steps} steps "
          f"(best at {r.best_step}) on {s.train_positions} positions, {seconds:.0f} s, "
          f"peak RSS {peak_mib:.0f} MiB")
    print(f"held-out BPB {r.heldout_bpb_before:.4f} -> {r.heldout_bpb_after:.4f} "
          f"({r.heldout_bpb_after / r.heldout_bpb_before - 1:+.1%}); adapter file "
          f"{report.adapter_bytes / 2**20:.2f} MB ({s.file})")
    for source, (before, after) in report.heldout_by_source.items():
        print(f"  {source:<12}{before:>8.4f} -> {after:.4f}")
    if args.refit_penalty and Manifest.load(report.checkpoint).penalty(args.head) is not None:
        # The router's quality bound reads the stored fit: refit it on the adapted head so
        # adaptation moves traffic without a manual step.
        t1 = time.perf_counter()
        fits = fit_penalties(report.checkpoint)
        fit = fits[args.head]
        print(f"router penalty of {args.head}: {fit.per_split:.3g} x split share + "
              f"{fit.per_fallback_share:.3g} x fallback ({time.perf_counter() - t1:.0f} s)")

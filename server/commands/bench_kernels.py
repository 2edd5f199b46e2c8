"""polyhead bench kernels: unembedding + sampling paths per (b, V) on this device."""

from __future__ import annotations

import argparse
from pathlib import Path

from server.commands.kernels import DEMO_D


def register_bench(bsub: argparse._SubParsersAction) -> None:
    p = bsub.add_parser("kernels", help="unembedding kernels: reference vs split vs streaming")
    p.add_argument("--b", type=int, nargs="+", default=[1, 4, 16, 64, 256], help="group sizes")
    p.add_argument("--vocab", type=int, nargs="+", default=[32768, 131072, 262144])
    p.add_argument("--d", type=int, default=DEMO_D, help="hidden size (default 640)")
    p.add_argument("--dtype", default=None, choices=["bfloat16", "float32", "float16"],
                   help="weight dtype (default: bfloat16 for the sweep; float32 for mixed, "
                        "what the CPU engine computes in)")
    p.add_argument("--mode", default="sample", choices=["greedy", "sample", "top_k", "top_p"])
    p.add_argument("--repeats", type=int, default=3, help="timed calls per point (median)")
    p.add_argument("--quick", action="store_true",
                   help="smoke mode: b 1 4, V 4096 8192, d 128, one repeat")
    p.add_argument("--threads", type=int, default=0,
                     help="torch CPU threads (default: torch's choice)")
    p.add_argument("--out", type=Path, default=Path("bench-out/kernels"),
                   help="directory for JSON, CSV and PNG (default bench-out/kernels)")
    p.add_argument("--scenario", default="sweep", choices=["sweep", "mixed"],
                   help="sweep: paths per (b, V); mixed: a step of several nested heads, per "
                        "group and in one nested pass, against the largest head alone")
    p.add_argument("--mix", nargs="+", default=None, metavar="VxB+VxB",
                   help="mixed scenario: mixes such as 262144x1+131072x8 (default: eight "
                        "mixes up to B=16)")
    p.set_defaults(run=_bench)


def _bench(args: argparse.Namespace) -> None:
    import torch

    from kernels.bench.unembed import format_table, run_bench, write_outputs
    from kernels.dispatch import device_spec
    from server.ops.logging_setup import configure_logging

    configure_logging("text", "WARNING")
    if args.scenario == "mixed":
        _bench_mixed(args)
        return
    args.dtype = args.dtype or "bfloat16"
    if args.quick:
        args.b, args.vocab, args.d, args.repeats = [1, 4], [4096, 8192], 128, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    torch_device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = device_spec(torch_device)
    rows = run_bench(args.b, args.vocab, args.d, getattr(torch, args.dtype), args.mode, device,
                     torch_device, args.repeats)
    print(f"device: {device.name}: {device.peak_flops / 1e12:.2f} TFLOP/s bf16, "
          f"{device.mem_bw / 1e9:.0f} GB/s (ridge {device.ridge_point:.1f}); "
          f"torch threads {torch.get_num_threads()}; d={args.d} {args.dtype} {args.mode}")
    print(format_table(rows))
    for kind, path in write_outputs(rows, device, args.out).items():
        print(f"wrote {kind}: {path}")


def _bench_mixed(args: argparse.Namespace) -> None:
    import torch

    from kernels.bench.mixed import (
        DEFAULT_MIXES,
        format_mixed,
        parse_mix,
        run_mixed,
        write_mixed,
    )
    from kernels.dispatch import device_spec

    mixes = [parse_mix(m) for m in args.mix] if args.mix else DEFAULT_MIXES
    dtype = args.dtype or "float32"  # the CPU engine's compute dtype
    if args.quick:
        mixes, args.d, args.repeats = [{8192: 1, 4096: 1}, {8192: 2, 2048: 3}], 128, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    torch_device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = device_spec(torch_device)
    rows = run_mixed(mixes, args.d, getattr(torch, dtype), args.mode, device, torch_device,
                     args.repeats)
    print(f"device: {device.name}, {device.mem_bw / 1e9:.0f} GB/s; torch threads "
          f"{torch.get_num_threads()}; d={args.d} {dtype} {args.mode}; median of "
          f"{args.repeats}")
    print(format_mixed(rows))
    for kind, path in write_mixed(rows, device, args.out).items():
        print(f"wrote {kind}: {path}")

"""polyhead kernels ...: unembedding-kernel calibration for the per-batch selector."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

# The demo model's heads (Gemma-3-270M, d=640, and its trimmed vocabularies).
DEMO_HEADS = ("32k=32768", "131k=131072", "262k=262144")
DEMO_D = 640


def register(sub: argparse._SubParsersAction) -> None:
    kernels = sub.add_parser("kernels", help="unembedding kernels: calibration")
    ksub = kernels.add_subparsers(dest="kernels_command", required=True, metavar="KERNELS_COMMAND")
    cal = ksub.add_parser(
        "calibrate", help="sweep b per head and mode, write the crossover b* to the cache")
    cal.add_argument("--heads", nargs="+", default=list(DEMO_HEADS), metavar="NAME=V",
                     help="head shapes (default: the demo model's 32k/131k/262k)")
    cal.add_argument("--d", type=int, default=DEMO_D, help="hidden size (default 640)")
    cal.add_argument("--dtype", nargs="+", default=["bfloat16"],
                     choices=["bfloat16", "float32", "float16"])
    cal.add_argument("--modes", nargs="+", default=["greedy", "sample", "top_k", "top_p"],
                     choices=["greedy", "sample", "top_k", "top_p"])
    cal.add_argument("--b-max", type=int, default=512, help="largest group size (power of 2)")
    cal.add_argument("--repeats", type=int, default=5, help="timed calls per point (median)")
    cal.add_argument("--threads", type=int, default=0,
                     help="torch CPU threads (default: torch's choice)")
    cal.add_argument("--out", type=Path, help="directory (default $POLYHEAD_CACHE_DIR/"
                     "calibration, ~/.cache/polyhead/calibration)")
    cal.set_defaults(run=_calibrate)


def parse_heads(specs: list[str]) -> list[tuple[str, int]]:
    out = []
    for spec in specs:
        name, sep, vocab = spec.partition("=")
        if not sep or not vocab.isdigit():
            raise ValueError(f"head must be NAME=V, got {spec!r}")
        out.append((name, int(vocab)))
    return out


def _calibrate(args: argparse.Namespace) -> None:
    import torch

    from heads.model.native import build as native_build
    from kernels.calibrate import Shape, calibrate
    from kernels.crossover_calibration import save_calibration
    from kernels.dispatch import device_spec
    from kernels.roofline import DTYPE_BYTES
    from server.ops.logging_setup import configure_logging

    configure_logging("text", "INFO")
    native_build.load()  # the engine's GEMVs (bf16 and int8) take part in the sweeps
    if args.threads:
        torch.set_num_threads(args.threads)
    torch_device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = device_spec(torch_device)
    shapes = [Shape(n, v, args.d) for n, v in parse_heads(args.heads)]
    dtypes = [getattr(torch, d) for d in args.dtype]
    cal = calibrate(shapes, dtypes, args.modes, device, torch_device, args.b_max, args.repeats)
    path = save_calibration(cal, args.out)
    roof = cal.roofline(device)
    print(f"device: {device.name}, streaming kernel: {cal.meta['stream_kernel']}")
    print(f"roofline: {roof.mem_bw / 1e9:.1f} GB/s, {roof.peak_flops / 1e12:.2f} TFLOP/s, ridge "
          f"point {roof.ridge_point:.1f} FLOP/B ("
          + ("measured here: " + json.dumps(cal.meta["roofline"])
             if "roofline" in cal.meta else "guessed from the device table")
          + f"; the uncalibrated guess: {device.mem_bw / 1e9:.1f} GB/s, "
            f"{device.peak_flops / 1e12:.2f} TFLOP/s)")
    print(f"{'head':<8}{'V':>8}{'dtype':>10}{'mode':>8}{'b*':>8}  swept b")
    for e in cal.entries.values():
        b = "inf" if e["b_star"] is None else f"{e['b_star']:.1f}"
        print(f"{e['head']:<8}{e['V']:>8}{e['dtype']:>10}{e['mode']:>8}{b:>8}  "
              f"{e['b'][0]}..{e['b'][-1]}")
    print("\nper point, against the roofline bound max(bytes / BW, FLOP / peak):")
    print(f"{'head':<8}{'dtype':>10}{'mode':>8}{'b':>5}{'kernel':>8}{'ms':>9}{'GB/s':>8}"
          f"{'TFLOP/s':>9}{'bound ms':>10}{'of roof':>9}")
    for e in cal.entries.values():
        w_bytes = e["V"] * e["d"] * DTYPE_BYTES[e["dtype"]]
        for i, b in enumerate(e["b"]):
            flops = 2 * b * e["V"] * e["d"]
            bound = max(w_bytes / roof.mem_bw, flops / roof.peak_flops)
            for kernel, key in (("stream", "t_stream_s"), ("split", "t_split_s")):
                t = e[key][i]
                print(f"{e['head']:<8}{e['dtype']:>10}{e['mode']:>8}{b:>5}{kernel:>8}"
                      f"{t * 1e3:>9.2f}{w_bytes / t / 1e9:>8.1f}{flops / t / 1e12:>9.3f}"
                      f"{bound * 1e3:>10.2f}{bound / t:>9.0%}")
    int8 = cal.meta.get("int8")
    if isinstance(int8, dict):
        _print_int8(int8, roof.mem_bw)
    print("fitted efficiency: " + ", ".join(
        f"{k} {v:.2f}" for k, v in cal.efficiency.items() if not math.isnan(v)))
    print(f"wrote {path}")


def _print_int8(entry: dict, mem_bw: float) -> None:
    """The weights choice per b: the file's integer groups against packed bf16."""
    n, k = entry["shape"]
    print(f"\nweights per product of b rows, [{n}, {k}] (integer groups "
          f"{entry['int8_bytes'] / 1e6:.0f} MB, bf16 {entry['bf16_bytes'] / 1e6:.0f} MB; "
          f"read bound at {mem_bw / 1e9:.1f} GB/s):")
    print(f"{'b':>4}{'int8 ms':>10}{'GB/s':>7}{'bf16 ms':>10}{'GB/s':>7}{'int8 / bf16':>13}"
          "  choice")
    rows = entry["int8_rows"]
    for b, ti, tb in zip(entry["b"], entry["t_int8_s"], entry["t_bf16_s"], strict=True):
        print(f"{b:>4}{ti * 1e3:>10.2f}{entry['int8_bytes'] / ti / 1e9:>7.1f}{tb * 1e3:>10.2f}"
              f"{entry['bf16_bytes'] / tb / 1e9:>7.1f}{tb / ti:>12.2f}x  "
              f"{'int8' if b <= rows else 'bf16'}")
    print(f"int8 for products of at most {rows} rows (weights=auto)")

"""polyhead bench engine: decode speed per head, local engine vs transformers, stock vLLM on
each head's own export, and vLLM with polyhead's multi-head plugin (plus a mixed-head batch);
with the local engine also prefix-cache TTFT (cold vs warm) and KV bytes per request."""

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
    p.add_argument("--backends", "--backend", default="local,transformers,vllm,vllm-stock",
                   help="comma-separated: local, transformers, vllm (the multi-head plugin; "
                        "also times a batch mixing the smallest and largest head), vllm-stock "
                        "(stock vLLM on each head's `export vllm --per-head` directory, the "
                        "baseline of the targets)")
    p.add_argument("--heads", help="comma-separated head names (default: all)")
    p.add_argument("--grouped", default="",
                   help="comma-separated split heads (e.g. 32k): the local engine also runs "
                        "each one's two-level reading (<head>+groups), alone and half and half "
                        "with the native head, in turns with the native head alone")
    p.add_argument("--repeats", type=int, default=1, help="best of this many timed runs")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "stored"], default="auto",
                   help="compute dtype for every engine; auto (default): each engine's own "
                        "default, what `serve` and stock vLLM run (bf16 where the CPU has a "
                        "bf16 GEMM); stored: the checkpoint's")
    p.add_argument("--weights", choices=["auto", "quantized", "bf16"], default="auto",
                   help="which bytes the local engine's products read where the checkpoint "
                        "keeps the model file's integer groups (POLYHEAD_WEIGHTS): auto "
                        "(default) int8 up to the calibrated batch, bf16 the dequantised "
                        "weights only")
    p.add_argument("--out", type=Path, default=Path("bench-results"),
                   help="directory for bench_engine.json and .png")
    p.add_argument("--scenarios", default="decode,prefix,kv",
                   help="comma-separated: decode (the table above), prefix (cold vs warm "
                        "TTFT behind a shared system prompt), kv (KV bytes per request)")
    p.add_argument("--prefix-tokens", type=int, default=1536,
                   help="prefix scenario: shared system prompt length")
    p.add_argument("--calibration-out", type=Path, default=None, metavar="FILE",
                   help="also write the local engine's measured decode steps (JSON) for the "
                        "router's cost calibration: serve's calibration_file, simulate "
                        "--calibration, bench replay --calibration")
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> None:
    from heads.bench.engine import bench
    from heads.bench.engine_report import reading_lines, roofline_lines, table, verdicts, write
    from heads.engine.cpu_linear import auto_compute_dtype
    from server.commands.errors import CliError
    from server.ops.logging_setup import configure_logging

    configure_logging("text", "INFO")
    engines = [e.strip() for e in args.backends.split(",") if e.strip()]
    unknown = set(engines) - {"local", "transformers", "vllm", "vllm-stock"}
    if unknown or args.tokens < 2 or not args.batches or min(args.batches) < 1:
        raise CliError(f"bad arguments: engines {sorted(unknown)}, --tokens >= 2, batches >= 1")
    model = args.model
    if model is None:
        from server.model_source import resolve_model_dir
        from server.settings import load_settings

        model = resolve_model_dir("gemma3-270m", load_settings(None).cache_dir)
    if args.calibration_out is not None and "local" not in engines:
        raise CliError("--calibration-out measures the local engine: add it to --backends")
    heads = [h for h in (args.heads or "").split(",") if h]
    dtype = None if args.dtype == "stored" else args.dtype
    local_dtype = auto_compute_dtype() if dtype == "auto" else dtype  # what the local engine runs
    scenarios = {s.strip() for s in args.scenarios.split(",") if s.strip()}
    if scenarios - {"decode", "prefix", "kv"}:
        raise CliError(f"bad --scenarios {args.scenarios!r}: use decode, prefix, kv")
    timings: list = []
    if "decode" in scenarios:
        rows = bench(model, args.batches, args.tokens, args.threads, engines, args.repeats,
                     heads, dtype, timings, [h for h in args.grouped.split(",") if h],
                     args.weights)
        print(table(rows))
        for line in reading_lines(rows):
            print(line)
        for verdict in verdicts(rows):
            print(verdict)
        if "local" in engines and 1 in args.batches:
            import torch

            from heads.manifest import Manifest
            from kernels.machine import read_bandwidth

            torch.set_num_threads(args.threads)  # the engines' threads read at this rate
            backbone = Manifest.load(model).backbone
            for line in roofline_lines(rows, backbone.num_parameters(), backbone.hidden_size,
                                       read_bandwidth()):
                print(line)
        js, png = write(rows, args.out)
        print(f"wrote {js} and {png}")
    if "local" in engines and scenarios & {"prefix", "kv"}:
        _local_scenarios(args, model, local_dtype, heads, scenarios)
    if args.calibration_out is not None:
        _write_calibration(args, model, local_dtype, timings)


def _local_scenarios(args: argparse.Namespace, model: Path, dtype: str | None, heads: list[str],
                     scenarios: set[str]) -> None:
    import json
    from dataclasses import asdict

    import torch

    from heads.bench.prefix import kv_per_request, kv_table, prefix_table, prefix_ttft
    from heads.model.weights import load_checkpoint

    torch.set_num_threads(args.threads)
    ckpt = load_checkpoint(model, compute_dtype=dtype)
    out: dict = {}
    if "prefix" in scenarios:
        names = heads or sorted(ckpt.model.heads, key=lambda h: ckpt.model.heads[h].vocab_size)
        prefix = [prefix_ttft(ckpt, h, args.prefix_tokens, repeats=max(3, args.repeats))
                  for h in names]
        print(f"\nprefix cache, local engine ({args.threads} thread(s), median of "
              f"{max(3, args.repeats)}):")
        print(prefix_table(prefix))
        out["prefix_cache"] = [asdict(r) | {"ratio": r.ratio} for r in prefix]
    if "kv" in scenarios:
        kv = kv_per_request(ckpt)
        print(f"\nKV per request ({ckpt.model.dtype_name}), sliding-window KV off vs on:")
        print(kv_table(kv))
        out["kv_per_request"] = [asdict(r) | {"ratio": r.ratio} for r in kv]
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "bench_engine_local.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")


def _write_calibration(args: argparse.Namespace, model: Path, dtype: str | None,
                       timings: list) -> None:
    from heads.manifest import Manifest
    from router.step_time_file import StepSamples, timer_from_file, write_step_samples
    from router.step_time_fit import StepSample
    from server.bootstrap import device_spec, head_profiles

    manifest = Manifest.load(model)
    data = StepSamples(
        device_spec("auto"), tuple(head_profiles(manifest, dtype)),
        tuple(StepSample(t.groups, t.seconds) for t in timings),
        {"model": manifest.model_name, "model_dir": str(model), "dtype": dtype or manifest.dtype,
         "threads": args.threads, "batches": args.batches, "new_tokens": args.tokens})
    path = write_step_samples(args.calibration_out, data)
    fit = timer_from_file(path).fit
    summary = (f"fit: overhead {1e3 * fit.overhead_s:.2f} ms, memory x{fit.mem_scale:.2f}, "
               f"compute x{fit.cmp_scale:.2f} of the roofline, rms error "
               f"{fit.rms_rel_error:.1%}" if fit else "too few distinct steps to fit")
    print(f"wrote {len(data.samples)} decode-step samples to {path} ({summary})")

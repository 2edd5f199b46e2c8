"""polyhead bench vs-vllm: polyhead serve against stock vllm serve at its defaults, on the
native head and on the 131k head's export, with vLLM's own `vllm bench serve`, on committed
English and multilingual prompts."""

from __future__ import annotations

import argparse
from pathlib import Path


def register_bench(bsub: argparse._SubParsersAction) -> None:
    p = bsub.add_parser("vs-vllm", help="polyhead serve vs stock vllm serve (vllm bench serve)")
    p.add_argument("--model", default="gemma3-270m", help="built-in name or checkpoint dir")
    p.add_argument("--concurrency", default="1,8,32", help="comma-separated")
    p.add_argument("--prompts", default="english,multilingual", help="comma-separated sets")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--threads", type=int, default=1,
                   help="polyhead's torch threads (vLLM on CPU binds one OMP thread here)")
    p.add_argument("--stock-heads", default=None,
                   help="comma-separated heads stock vLLM serves, each from its own export: "
                        "head names, 'native' and 'second' (the largest head below native); "
                        "default native,second")
    p.add_argument("--pin", default=None,
                   help="serve every request on this head (polyhead's per-head route) instead "
                        "of routing, against stock on that head's export alone (the default "
                        "--stock-heads becomes this head)")
    p.add_argument("--llama-cpp", default=None, metavar="PATH",
                   help="a llama-server binary: also serve the model's GGUF with it (label "
                        "llama.cpp, --threads threads, one slot per client of the largest "
                        "concurrency); without it that label is skipped")
    p.add_argument("--gguf", type=Path, default=None,
                   help="the GGUF llama-server loads (default: the built-in model's own file)")
    p.add_argument("--out", type=Path, default=Path("bench-results/vs-vllm"))
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> None:
    from heads.loaders.fetch import RECIPES, fetch_gguf
    from heads.manifest import Manifest
    from server.bench.gateway import free_port, gateway
    from server.bench.llama_cpp import LABEL, find_binary, llama_server
    from server.bench.vs_vllm import (
        PROMPT_SETS,
        bench_serve,
        cell,
        decisions,
        logs_dir,
        native_export,
        second_largest,
        share_delta,
        stock_server,
        table,
        verdicts,
        write,
    )
    from server.model_source import resolve_model_dir
    from server.settings import load_settings

    settings = load_settings(None)
    model_dir = resolve_model_dir(args.model, settings.cache_dir)
    manifest = Manifest.load(model_dir)
    stock_dir = native_export(model_dir, manifest, settings.cache_dir)
    tokenizer = stock_dir  # a transformers directory: the bench counts tokens
    sets = [s.strip() for s in args.prompts.split(",") if s.strip()]
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    logs, cells = logs_dir(), []
    native = manifest.native.name
    alias = {"native": native, "second": second_largest(manifest)}
    label = "polyhead"
    endpoint = "/v1/completions"
    if args.pin:
        pin = alias.get(args.pin, args.pin)
        label, endpoint = f"polyhead:{pin}", f"/heads/{pin}/v1/completions"
        # Tokens counted with the pinned head's own tokenizer, as stock on its export counts.
        tokenizer = native_export(model_dir, manifest, settings.cache_dir, pin)
    stock_heads = args.stock_heads or (args.pin if args.pin else "native,second")
    with gateway(str(model_dir), free_port(), logs / "polyhead.log",
                 POLYHEAD_TORCH_THREADS=str(args.threads),
                 POLYHEAD_CACHE_DIR=str(logs / "cache")) as url:
        for name in sets:
            for c in levels:
                before = decisions(url)
                r = bench_serve(url, manifest.model_name, tokenizer, PROMPT_SETS[name], c,
                                args.num_prompts, args.output_len, args.out / label / name,
                                endpoint)
                cells.append(cell(label, name, c, r, share_delta(before, decisions(url))))
    for head in [alias.get(h.strip(), h.strip()) for h in stock_heads.split(",")]:
        if head is None:
            continue
        stock = "stock" if head == native else f"stock-{head}"
        export = native_export(model_dir, manifest, settings.cache_dir, head)
        with stock_server(export, free_port(), logs / f"{stock}.log") as url:
            for name in sets:
                for c in levels:
                    # Each export counts its own tokens; bytes/s, the compared unit, does not
                    # depend on the tokenizer.
                    r = bench_serve(url, "stock", export, PROMPT_SETS[name], c,
                                    args.num_prompts, args.output_len, args.out / stock / name)
                    cells.append(cell(stock, name, c, r, {}))
    binary = find_binary(args.llama_cpp)
    if binary is None:
        print("llama.cpp: skipped (no --llama-cpp PATH to a llama-server binary)")
    else:
        if args.gguf is None and args.model not in RECIPES:
            raise SystemExit(f"--llama-cpp: {args.model} is not a built-in; name its --gguf")
        gguf = args.gguf or fetch_gguf(args.model, settings.cache_dir, progress=False)
        with llama_server(binary, gguf, free_port(), logs / "llama.cpp.log", max(levels),
                          args.threads) as url:
            for name in sets:
                for c in levels:
                    r = bench_serve(url, LABEL, stock_dir, PROMPT_SETS[name], c,
                                    args.num_prompts, args.output_len, args.out / LABEL / name)
                    cells.append(cell(LABEL, name, c, r, {}))
    lines = verdicts(cells, manifest)
    print(table(cells))
    print("\n".join(lines))
    print(f"wrote {write(cells, lines, args.out)} (logs in {logs})")

"""polyhead export vllm: a checkpoint as a model directory vLLM loads
(heads/vllm_plugin/export.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from kernels.cache_paths import default_cache_root


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write a checkpoint in another engine's format")
    targets = p.add_subparsers(dest="target", required=True, metavar="TARGET")
    v = targets.add_parser("vllm", help="one vLLM model serving every head (the plugin)")
    v.add_argument("checkpoint", help="checkpoint directory or built-in model name")
    v.add_argument("--out", type=Path, required=True)
    v.add_argument("--per-head", action="store_true",
                   help="the fallback: one stock model directory per head, under --out")
    v.add_argument("--cache-dir", type=Path, default=default_cache_root())
    v.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from heads.vllm_plugin.export import export_vllm, export_vllm_per_head
    from server.model_source import resolve_model_dir

    src = resolve_model_dir(args.checkpoint, args.cache_dir)
    if args.per_head:
        for head, d in export_vllm_per_head(src, args.out).items():
            print(f"{head}\t{d}")
        return
    layout = export_vllm(src, args.out)
    print(f"{args.out}: vocab_size {layout.total_vocab}")
    for h in layout.heads:
        print(f"  {h.name}\toffset {h.offset}\tV {h.vocab_size}")

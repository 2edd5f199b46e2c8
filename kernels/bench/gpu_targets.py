"""GPU targets of the unembedding kernels, measured natively (kernels/bench/gpu.sh, CUDA).

1. b=1, V=262144, d=640 bf16, fused: % of HBM bandwidth (W bytes / time; target >= 80%).
2. b=256, split path's GEMM: % of dense bf16 peak (target >= 50%), and the whole split step.
3. b <= 16: fused over split speedup, sample mode (target >= 1.15x).
Prints a table and writes JSON; never asserts.
"""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path

import torch

from kernels import split, triton_fused
from kernels.bench.unembed import _call
from kernels.dispatch import device_spec
from kernels.timing import hidden_states, median_time, mode_batch, weight_copies

V, D = 262144, 640


def main(out: Path) -> None:
    dev = torch.device("cuda")
    spec = device_spec(dev)
    w = weight_copies(V, D, torch.bfloat16, dev)
    w_bytes = V * D * 2
    res: dict[str, object] = {"device": spec.name, "gpu": torch.cuda.get_device_name(dev)}
    for mode in ("greedy", "sample"):
        h, batch = hidden_states(1, D, torch.bfloat16, dev), mode_batch(mode, 1)
        t = median_time(partial(_call, triton_fused.unembed_and_sample, h, batch), w, 20, 3)
        res[f"b1_fused_{mode}_us"] = t * 1e6
        res[f"b1_fused_{mode}_pct_hbm"] = 100 * w_bytes / t / spec.mem_bw
    h = hidden_states(256, D, torch.bfloat16, dev)
    t = median_time(lambda x, h=h: split.logits_fp32(h, x), w, 20, 3)
    res["b256_split_gemm_us"] = t * 1e6
    res["b256_split_gemm_pct_peak"] = 100 * 2 * 256 * V * D / t / spec.peak_flops
    batch = mode_batch("sample", 256)
    t = median_time(partial(_call, split.unembed_and_sample, h, batch), w, 10, 2)
    res["b256_split_step_pct_peak"] = 100 * 2 * 256 * V * D / t / spec.peak_flops
    for b in (1, 4, 8, 16):
        h, batch = hidden_states(b, D, torch.bfloat16, dev), mode_batch("sample", b)
        tf = median_time(partial(_call, triton_fused.unembed_and_sample, h, batch), w, 20, 3)
        ts = median_time(partial(_call, split.unembed_and_sample, h, batch), w, 20, 3)
        res[f"b{b}_fused_over_split"] = ts / tf
    for k, v in res.items():
        sys.stdout.write(f"{k:<32} {v:.2f}\n" if isinstance(v, float) else f"{k:<32} {v}\n")
    out.write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "gpu_targets.json"))

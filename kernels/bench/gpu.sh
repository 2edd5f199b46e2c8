#!/usr/bin/env bash
# GPU check for the unembedding kernels, < 8 minutes on one H200:
#   1. the kernel tests natively (gpu-marked: fused and split vs the reference),
#   2. the targets (kernels/bench/gpu_targets.py),
#   3. a short calibration of the demo heads and the benchmark table + PNG.
# Usage: kernels/bench/gpu.sh [OUT_DIR]   (from the repository root; needs CUDA + triton)
set -euo pipefail
OUT="${1:-${OUT:-bench-out/gpu}}"
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python
mkdir -p "$OUT"
export POLYHEAD_CACHE_DIR="$OUT/cache"
unset TRITON_INTERPRET
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
echo "== 1. kernel tests (native)"
timeout 150 "$PY" -m pytest -q -m gpu tests/kernels -p no:cacheprovider 2>&1 | tail -n 15 \
  | tee "$OUT/tests.txt" || true
echo "== 2. targets"
timeout 120 "$PY" -m kernels.bench.gpu_targets "$OUT/gpu_targets.json" | tee "$OUT/targets.txt"
echo "== 3. calibration + benchmark"
timeout 90 "$PY" -m server.cli kernels calibrate --modes greedy sample --b-max 512 --repeats 5 \
  | tee "$OUT/calibrate.txt"
timeout 90 "$PY" -m server.cli bench kernels --b 1 4 16 64 256 --repeats 10 --out "$OUT" \
  | tee "$OUT/bench.txt"
echo "wrote $OUT"

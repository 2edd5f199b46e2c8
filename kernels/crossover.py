"""The one kernel-crossover rule: the head-group size b* from which GEMM + sampler ("split")
is no slower than the streaming kernel.

Both the engine's selector (which kernel runs this step) and the router's cost model (what a
step costs) read b* here, so the two cannot disagree. b* comes from the device's calibration
when it has the exact (V, d, dtype, mode), else from the roofline, refitted with the
calibration's efficiencies when it has any. Pure Python (no torch).
"""

from __future__ import annotations

from functools import lru_cache

from kernels.crossover_calibration import CrossoverCalibration
from kernels.devices import DeviceSpec
from kernels.roofline import DTYPE_BYTES, SPLIT_ONLY, Efficiency, roofline_crossover

# The sampling mode the router assumes for a group: it routes before it knows the batch's mix
# of options, and temperature sampling is the API's default.
DEFAULT_MODE = "sample"


@lru_cache(maxsize=4096)
def _roofline_b_star(vocab: int, d: int, dtype: str, mode: str, device: DeviceSpec,
                     eff: Efficiency | None) -> float:
    # roofline_crossover scans b = 1..4096; the router asks per request and head, so memoize.
    return roofline_crossover(vocab, d, dtype, mode, device, eff)


def crossover_batch(
    vocab: int, d: int, dtype: str, mode: str, device: DeviceSpec,
    calibration: CrossoverCalibration | None = None,
) -> tuple[float, str]:
    """(b*, source): split from b >= b*; inf when streaming always wins. source is
    "calibration", "roofline" or "split_only"."""
    if mode == SPLIT_ONLY:
        return 1.0, SPLIT_ONLY
    if calibration is not None and calibration.device == device.name:
        b = calibration.b_star(vocab, d, dtype, mode)
        if b is not None:
            return b, "calibration"
        return _roofline_b_star(vocab, d, dtype, mode, device, calibration.fitted()), "roofline"
    return _roofline_b_star(vocab, d, dtype, mode, device, None), "roofline"


def picks_split(
    b: int, vocab: int, d: int, dtype: str, mode: str, device: DeviceSpec,
    calibration: CrossoverCalibration | None = None,
) -> bool:
    """Whether a group of b rows runs GEMM + sampler (and so materializes its b×V logits)."""
    return b >= crossover_batch(vocab, d, dtype, mode, device, calibration)[0]


def dtype_for_bytes(weight_bytes: float) -> str:
    """The weight dtype name for a size in bytes per parameter (2 -> bfloat16, 4 -> float32)."""
    for name in ("bfloat16", "float32"):
        if DTYPE_BYTES[name] == weight_bytes:
            return name
    raise ValueError(f"no weight dtype of {weight_bytes} bytes (known: 2, 4)")

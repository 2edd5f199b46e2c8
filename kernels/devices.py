"""Device rooflines: peak dense bf16 FLOP/s, memory bandwidth, per-step overhead.

Pure Python on purpose (no torch): `router` re-exports this table and must stay light.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from kernels.errors import UnknownDevice

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    name: str
    peak_flops: float  # dense bf16 FLOP/s (no sparsity)
    mem_bw: float  # memory bandwidth, B/s
    launch_overhead_s: float = 0.0  # fixed host + kernel-launch time per decode step, s

    def __post_init__(self) -> None:
        if self.peak_flops <= 0 or self.mem_bw <= 0:
            raise ValueError(f"{self.name}: peak_flops and mem_bw must be > 0")
        if self.launch_overhead_s < 0:
            raise ValueError(f"{self.name}: launch_overhead_s must be >= 0")

    @property
    def ridge_point(self) -> float:
        """FLOP per byte above which a kernel is compute-bound."""
        return self.peak_flops / self.mem_bw

    @property
    def is_cpu(self) -> bool:
        return self.name == "cpu" or self.name.startswith("cpu:")


# Datasheet numbers, dense (non-sparse) bf16 tensor throughput. Step overheads are placeholders
# (tens of kernels per step at ~5 µs) used by router's cost model; kernels/roofline.py uses its
# own per-launch latency.
DEVICES: dict[str, DeviceSpec] = {
    spec.name: spec
    for spec in (
        # NVIDIA A10G (AWS G5; A10G is a lower-clocked A10): ~70 TFLOP/s bf16 tensor dense,
        # 600 GB/s GDDR6 (AWS G5 instance page / NVIDIA A10 datasheet) -> ρ ≈ 117.
        DeviceSpec("a10g", 70e12, 600e9, 50e-6),
        # NVIDIA L4 datasheet: 121 TFLOP/s bf16 dense (242 with sparsity), 300 GB/s -> ρ ≈ 403.
        DeviceSpec("l4", 121e12, 300e9, 50e-6),
        # NVIDIA A100 datasheet (40GB SXM): 312 TFLOP/s bf16 dense, 1,555 GB/s HBM2 -> ρ ≈ 201.
        DeviceSpec("a100-40", 312e12, 1.555e12, 30e-6),
        # NVIDIA A100 80GB SXM datasheet: 312 TFLOP/s bf16 dense, 2,039 GB/s HBM2e -> ρ ≈ 153.
        DeviceSpec("a100-80", 312e12, 2.039e12, 30e-6),
        # NVIDIA H100 datasheet, SXM: 989 TFLOP/s bf16 dense, 3.35 TB/s HBM3 -> ρ ≈ 295.
        DeviceSpec("h100-sxm", 989e12, 3.35e12, 20e-6),
        # NVIDIA H100 datasheet, PCIe: 756 TFLOP/s bf16 dense, 2.0 TB/s HBM2e -> ρ ≈ 378.
        DeviceSpec("h100-pcie", 756e12, 2.0e12, 20e-6),
        # NVIDIA H200 datasheet (SXM): 989 TFLOP/s bf16 dense, 4.8 TB/s HBM3e -> ρ ≈ 206.
        DeviceSpec("h200", 989e12, 4.8e12, 20e-6),
        # NVIDIA HGX B200 datasheet: 4.5 PFLOP/s bf16 with sparsity per GPU, i.e. 2.25 dense;
        # 8 TB/s HBM3e -> ρ ≈ 281.
        DeviceSpec("b200", 2.25e15, 8.0e12, 20e-6),
        # AMD Instinct MI300X datasheet: 1,307.4 TFLOP/s bf16 dense, 5.3 TB/s HBM3 -> ρ ≈ 247.
        DeviceSpec("mi300x", 1.3074e15, 5.3e12, 20e-6),
        # Generic server CPU socket (order of a 32-core AVX-512 part): ~2 TFLOP/s bf16,
        # ~100 GB/s DDR -> ρ = 20, inside the 16-32 range of a Zen-4 socket.
        DeviceSpec("cpu", 2e12, 100e9, 5e-6),
    )
}

# Substrings of torch.cuda.get_device_name() -> table entry; first match wins.
_GPU_NAMES = (
    ("A10G", "a10g"), ("L4", "l4"), ("A100-SXM4-40GB", "a100-40"), ("A100-PCIE-40GB", "a100-40"),
    ("A100", "a100-80"), ("H100 PCIe", "h100-pcie"), ("H100", "h100-sxm"), ("H200", "h200"),
    ("B200", "b200"), ("MI300X", "mi300x"),
)


def lookup_device(name: str) -> DeviceSpec:
    try:
        return DEVICES[name]
    except KeyError:
        raise UnknownDevice(f"unknown device {name!r} (known: {', '.join(DEVICES)})") from None


def device_for_gpu_name(gpu_name: str) -> DeviceSpec:
    """The table entry for a CUDA device name such as 'NVIDIA H200'."""
    for needle, key in _GPU_NAMES:
        if needle.lower() in gpu_name.lower():
            return DEVICES[key]
    raise UnknownDevice(f"no roofline entry for GPU {gpu_name!r} (known: {', '.join(DEVICES)})")


# bf16 FLOP per cycle per core by the best instruction set present. Assumed peaks: AMX tiles
# ~1024; AVX512-BF16 2 FMA ports × 16 fp32 lanes × 2 bf16 pairs × 2 FLOP = 128; plain
# AVX-512 (fp32 FMA, upconverting bf16) 64; AVX2+FMA 32; anything else (e.g. NEON) 16.
_FLOPS_PER_CYCLE = (("amx_bf16", 1024), ("avx512_bf16", 128), ("avx512f", 64), ("fma", 32))
_DEFAULT_FLOPS_PER_CYCLE = 16
_DEFAULT_GHZ = 2.5
# Bandwidth cannot be read from /proc; assume ~6 GB/s per core, clamped to what a desktop
# (20 GB/s) to a 12-channel DDR5 socket (460 GB/s) delivers.
_BW_PER_CORE = 6e9
_BW_RANGE = (20e9, 460e9)


def detect_cpu(cpuinfo: Path = Path("/proc/cpuinfo"), cores: int | None = None) -> DeviceSpec:
    """A rough roofline for this CPU: cores × clock × FLOP/cycle, bandwidth from core count.

    Treats every logical CPU from os.cpu_count() as a core (SMT overcounts compute) and the
    reported current clock as sustained. Good enough to place the ridge point; calibration
    measures both (kernels.machine) and replaces it (CrossoverCalibration.roofline).
    """
    text = cpuinfo.read_text() if cpuinfo.exists() else ""
    flags: set[str] = set()
    mhz, model = 0.0, "cpu"
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key in ("flags", "Features") and not flags:
            flags = set(value.split())
        elif key == "cpu MHz" and not mhz:
            mhz = float(value or 0)
        elif key == "model name" and model == "cpu":
            model = value
    n = cores if cores is not None else (os.cpu_count() or 1)
    per_cycle = next((f for flag, f in _FLOPS_PER_CYCLE if flag in flags), _DEFAULT_FLOPS_PER_CYCLE)
    ghz = mhz / 1000 if mhz > 0 else _DEFAULT_GHZ
    bw = min(max(n * _BW_PER_CORE, _BW_RANGE[0]), _BW_RANGE[1])
    spec = DeviceSpec(f"cpu:{model}", n * ghz * 1e9 * per_cycle, bw, 5e-6)
    log.debug(
        "detected %s: %.3g FLOP/s, %.3g B/s, ridge %.1f",
        spec.name, spec.peak_flops, spec.mem_bw, spec.ridge_point,
    )
    return spec

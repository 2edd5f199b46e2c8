"""Builds `fused_ops.cpp`, `int_groups_gemv.cpp` and `thread_pool.cpp` with torch's C++ extension
toolchain and loads them into `torch.ops.polyhead`.

The library is compiled for this CPU (`-march=native`: AVX-512 where it has it) into
`_build/<key>/` beside this file (polyhead's cache directory where that is read-only), the key
hashing the source, torch's version and the CPU's flags, so a checkout shared between
machines, or a new torch, never loads a stale build. `make install` builds it (`python -m
heads.model.native.build`); an engine that finds no build makes one (about a minute on two
cores), and one that cannot (no compiler) runs the eager ops.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import platform
import sys
import time
from pathlib import Path

import torch

from kernels.cache_paths import native_dir

log = logging.getLogger(__name__)

# The fused step ops, the products of a few rows against integer-grouped weights, and the
# release of a loader thread's OpenMP workers.
SOURCES = tuple(Path(__file__).with_name(f)
                for f in ("fused_ops.cpp", "int_groups_gemv.cpp", "thread_pool.cpp"))
LIBRARY = "polyhead_fused_ops"
# -fopenmp: at::parallel_for is an OpenMP loop in the headers; without it every op runs on one
# thread whatever torch.get_num_threads() says.
CFLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fopenmp")


def cpu_flags() -> str:
    """The CPU's feature flags (Linux), else the machine name: part of the build key."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return platform.machine()


def capability_flags(flags: str) -> tuple[str, ...]:
    """The CPU_CAPABILITY defines that pick at::vec's AVX-512 or AVX2 vectors, as torch builds
    its own kernels for this CPU; none gives the scalar fallback."""
    have = set(flags.split())
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= have:
        return ("-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512")
    if {"avx2", "fma"} <= have:
        return ("-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2")
    return ()


def compile_flags() -> list[str]:
    return [*CFLAGS, *capability_flags(cpu_flags())]


def build_key() -> str:
    h = hashlib.sha256()
    for source in SOURCES:
        h.update(source.read_bytes())
    for part in (torch.__version__, cpu_flags(), " ".join(compile_flags())):
        h.update(part.encode())
    return h.hexdigest()[:16]


def build_root() -> Path:
    here = Path(__file__).with_name("_build")
    if os.access(here if here.exists() else here.parent, os.W_OK):
        return here
    return native_dir()


def loaded() -> bool:
    return hasattr(torch.ops.polyhead, "add_rms_norm")


def load(root: Path | None = None, build: bool = True) -> bool:
    """Load the library into this process, building it first if there is no build for this
    machine and `build`. -> whether torch.ops.polyhead has the fused ops. Never raises for a
    failed build: the caller runs the eager ops instead."""
    if loaded():
        return True
    out = (root or build_root()) / build_key()
    built = out / f"{LIBRARY}.so"
    if not built.exists() and not build:
        return False
    from torch.utils import cpp_extension  # imports setuptools: only when needed

    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    try:
        # Rebuilds nothing when `built` is current (ninja); locks `out` against a
        # concurrent build by another process.
        cpp_extension.load(name=LIBRARY, sources=[str(s) for s in SOURCES],
                           build_directory=str(out),
                           extra_cflags=compile_flags(), is_python_module=False, verbose=False)
    except (RuntimeError, OSError, ImportError) as e:  # no compiler, no ninja, a bad build
        log.warning("fused CPU ops unavailable, running the eager ops: %s", e)
        return False
    log.info("fused CPU ops loaded from %s (%.1f s)", out, time.perf_counter() - started)
    return loaded()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build polyhead's fused CPU ops for this machine.")
    parser.add_argument("--dir", type=Path, default=None, help=f"default: {build_root()}")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ok = load(args.dir)
    sys.stdout.write(f"fused CPU ops: {'built' if ok else 'NOT built (the engine runs eager ops)'}"
                     f" in {(args.dir or build_root()) / build_key()}\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Transparent huge pages under the weights a CPU decode step streams.

A decode step reads every weight once: hundreds of MB per step on 4 KiB pages is one TLB
entry, and one page walk, per 4 KiB. On 2 MiB pages the same read takes 512× fewer walks
and the hardware prefetchers run on. Linux gives anonymous memory huge pages only where it
is told to (`/sys/kernel/mm/transparent_hugepage/enabled` is `madvise` on most distributions),
and torch, oneDNN and vLLM allocate their packed weights with plain malloc, so this module
tells it afterwards: `madvise(MADV_HUGEPAGE)` on each large mapping, then `MADV_COLLAPSE`
(Linux 6.1+) to move the pages already written into huge pages now rather than whenever
khugepaged gets to them.

Mappings are found in /proc/self/maps: anonymous, private, writable, at least one huge
page; the brk heap among them (malloc puts allocations below its mmap threshold there: the
demo's packed backbone projections, a few MB each, are most of its 360 MB). Callers pass
the mappings that appeared while their weights were allocated, so memory that is reserved
but never written (thread stacks, arenas) is not filled in. Elsewhere (not Linux, THP off)
every call is a no-op returning 0.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20  # bytes, x86-64 and arm64 (4 KiB base pages)
MIN_BYTES = HUGE_PAGE  # a smaller mapping holds no whole huge page
_MADV_HUGEPAGE, _MADV_COLLAPSE = 14, 25  # <linux/mman.h>
_THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")

Mapping = tuple[int, int]  # [start, end) virtual addresses


def available() -> bool:
    """Whether this kernel gives anonymous memory huge pages on request."""
    try:
        return "[never]" not in _THP.read_text()
    except OSError:
        return False


def mappings(min_bytes: int = MIN_BYTES, maps: Path = Path("/proc/self/maps")) -> set[Mapping]:
    """This process's anonymous private writable mappings (the heap included) of at least
    `min_bytes`."""
    out: set[Mapping] = set()
    try:
        lines = maps.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        fields = line.split()
        # start-end perms offset dev inode [path]: a file or [stack] is not ours
        anonymous = len(fields) == 5 or (len(fields) == 6 and fields[5] == "[heap]")
        if not anonymous or not fields[1].startswith("rw") or fields[1][3] != "p":
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        if end - start >= min_bytes:
            out.add((start, end))
    return out


@functools.cache
def _madvise() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    fn = ctypes.CDLL(name, use_errno=True).madvise
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def back(ranges: set[Mapping]) -> int:
    """Huge pages under each mapping's 2 MiB-aligned interior; bytes now on huge pages (those
    advised only, where the kernel cannot collapse, are left to khugepaged)."""
    madvise = _madvise()
    if not ranges or madvise is None or not available():
        return 0
    done = 0
    for start, end in sorted(ranges):
        a = -(-start // HUGE_PAGE) * HUGE_PAGE
        b = end // HUGE_PAGE * HUGE_PAGE
        if b <= a or madvise(a, b - a, _MADV_HUGEPAGE) != 0:
            continue
        if madvise(a, b - a, _MADV_COLLAPSE) == 0:
            done += b - a
        else:  # EINVAL before Linux 6.1; EAGAIN/ENOMEM when no huge page is free
            log.debug("MADV_COLLAPSE on %#x-%#x: %s", a, b, os.strerror(ctypes.get_errno()))
    return done

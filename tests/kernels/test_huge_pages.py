"""Huge pages under large resident mappings (kernels.huge_pages), on this process."""

from __future__ import annotations

import mmap
import os
import re
from pathlib import Path

import pytest
import torch

from kernels import huge_pages


def _huge_bytes(start: int, end: int) -> int:
    """AnonHugePages of the mappings overlapping [start, end), from /proc/self/smaps (advising
    part of a mapping splits it)."""
    text = Path("/proc/self/smaps").read_text()
    total = 0
    for block in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", text):
        lo, hi = (int(x, 16) for x in block.split(" ", 1)[0].split("-"))
        m = re.search(r"AnonHugePages:\s+(\d+) kB", block)
        if lo < end and start < hi and m:
            total += int(m.group(1)) << 10
    return total


def _kernel() -> tuple[int, int]:
    major, minor = re.match(r"(\d+)\.(\d+)", os.uname().release).groups()  # type: ignore[union-attr]
    return int(major), int(minor)


def test_mappings_parses_anonymous_writable_ones(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text(
        "7f0000000000-7f0002000000 rw-p 00000000 00:00 0 \n"  # 32 MiB anonymous: kept
        "7f0002000000-7f0002100000 rw-p 00000000 00:00 0 \n"  # 1 MiB: no whole huge page
        "7f0003000000-7f0005000000 r--p 00000000 08:01 123 /usr/lib/libx.so\n"
        "7f0006000000-7f0008000000 rw-s 00000000 00:05 9 /dev/shm/x\n"
        "7ffd00000000-7ffd04000000 rw-p 00000000 00:00 0 [stack]\n"
        "55aa00000000-55aa04000000 rw-p 00000000 00:00 0 [heap]\n")
    assert huge_pages.mappings(maps=maps) == {(0x7F0000000000, 0x7F0002000000),
                                              (0x55AA00000000, 0x55AA04000000)}


@pytest.mark.skipif(not huge_pages.available(), reason="transparent huge pages are off here")
def test_a_new_resident_mapping_moves_onto_huge_pages_intact() -> None:
    # Mapped here, so it is a new mapping whatever malloc did before (written: resident).
    size = 48 << 20
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    x = torch.frombuffer(region, dtype=torch.float32)
    x.copy_(torch.arange(size // 4, dtype=torch.float32))
    start = x.data_ptr()
    new = {(lo, hi) for lo, hi in huge_pages.mappings() if lo <= start < hi}
    assert new
    done = huge_pages.back(new)
    if _kernel() < (6, 1):
        pytest.skip("MADV_COLLAPSE needs Linux 6.1")
    # Every whole 2 MiB page inside it is a huge page now, and its values are kept.
    assert done >= size - 2 * huge_pages.HUGE_PAGE
    assert _huge_bytes(start, start + size) >= size - 2 * huge_pages.HUGE_PAGE
    assert torch.equal(x, torch.arange(size // 4, dtype=torch.float32))
    del x


def test_nothing_to_back_is_a_no_op() -> None:
    assert huge_pages.back(set()) == 0

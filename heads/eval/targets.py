"""MET or MISSED for the small heads' quality targets, from an eval-by-source table.

The smallest head (and its two-level reading, when scored) against native BPB: English prose
(the wiki source) at most 1.10x, the documentation sources at most 1.05x, German at most
1.30x; the middle head at most 1.02x on every source. A source the table lacks is skipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from heads.eval.measure import GROUPED

SMALL = {"wiki": 1.10, "python-doc": 1.05, "linux-doc": 1.05, "perl-doc": 1.05, "gcide": 1.05,
         "man-de": 1.30, "de": 1.30}
MIDDLE = 1.02


def quality_targets(table: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> list[str]:
    """One line per (head, source) target the table can judge."""
    out = []
    for source, row in table.items():
        heads = sorted((h for h in row if not h.endswith(GROUPED)),
                       key=lambda h: row[h]["vocab_size"])
        if len(heads) < 3:
            continue
        small, middle = heads[0], heads[1]
        bound = SMALL.get(source)
        for head in (small, small + GROUPED):
            if bound is not None and head in row:
                out.append(_line(head, source, row[head]["bpb_vs_native"], bound))
        out.append(_line(middle, source, row[middle]["bpb_vs_native"], MIDDLE))
    return out


def _line(head: str, source: str, ratio: float, bound: float) -> str:
    verdict = "MET" if ratio <= bound else "MISSED"
    return f"target {head} on {source} <= {bound:.2f}x native BPB: {ratio:.3f}x: {verdict}"

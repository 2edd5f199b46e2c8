"""Offline text of the non-language content classes a mixed trace holds: source code and
technical documentation, from the Python that runs polyhead (nothing to download).

- code: the standard library's own modules (`sysconfig`'s stdlib path), every `stride`-th of
  the sorted *.py files over 16 KB, each past its first 2 KB (skipping licence headers);
- docs: the Python reference manual's topic texts (`pydoc_data.topics`, the text `help()`
  shows), in key order.

Whitespace is kept: indentation is part of what a head must spell in code.
"""

from __future__ import annotations

import sysconfig
from functools import cache
from pathlib import Path

CONTENT_CLASSES = ("code", "docs")
CODE_FILES = 24  # modules in the code text
SKIP_CHARS = 2000  # each module's head: licence and import lines


@cache
def content_text(cls: str) -> str:
    if cls == "code":
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        files = sorted(p for p in stdlib.glob("*.py") if p.stat().st_size > 16_000)
        step = max(1, len(files) // CODE_FILES)
        return "\n\n".join(f.read_text(encoding="utf-8", errors="replace")[SKIP_CHARS:]
                           for f in files[::step][:CODE_FILES])
    if cls == "docs":
        from pydoc_data.topics import topics
        return "\n\n".join(v.strip() for _, v in sorted(topics.items()))
    raise ValueError(f"unknown content class {cls!r}; have {CONTENT_CLASSES}")

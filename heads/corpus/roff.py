"""Man pages (roff) to plain prose, for the translated-man-page corpus sources.

groff itself interprets the page (`groff -k -Tutf8 -mandoc`: preconv for the input encoding,
the man macros, UTF-8 output), so no roff request or escape reaches the text. It typesets
with a very long line (each paragraph on one line) and no hyphenation, and grotty is told to
emit no SGR or overstrike sequences. `groff_to_prose` then removes the layout: the page
header and footer lines, section headings (the only unindented lines), indentation and
column padding, and, for scripts written without spaces, the space a line join inserts
between two characters.
"""

from __future__ import annotations

import gzip
import logging
import re
import shutil
import subprocess

from heads.errors import CorpusError

log = logging.getLogger(__name__)

GROFF = ("groff", "-k", "-Tutf8", "-mandoc", "-rLL=5000n", "-rHY=0", "-P-cbou")
_CJK = r"\u3000-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uff00-\uffef"
_JOIN_SPACE = re.compile(rf"(?<=[{_CJK}]) (?=[{_CJK}])")


def groff_available() -> bool:
    return shutil.which("groff") is not None


def is_redirect(raw: bytes) -> bool:
    """A `.so other/page.1` stub (an alias page) has no text of its own."""
    return raw.lstrip().startswith(b".so ")


def render(raw: bytes, timeout: float = 60.0) -> str:
    """groff's UTF-8 rendering of one man page (raw roff bytes, gzip transparently)."""
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    try:
        r = subprocess.run(GROFF, input=raw, capture_output=True, timeout=timeout, check=False)
    except FileNotFoundError as e:
        raise CorpusError("groff not found: `apt-get install groff-base`") from e
    if r.returncode:
        err = r.stderr.decode("utf-8", errors="replace").strip().splitlines()[-1:] or ["?"]
        raise CorpusError(f"groff failed: {err[0]}")
    return r.stdout.decode("utf-8", errors="replace")


def groff_to_prose(rendered: str, unspaced: bool = False) -> list[str]:
    """Paragraphs of a groff -Tutf8 man page rendering, layout removed (see module doc).

    Lines of one block (no blank line between them, e.g. an option and its description)
    stay one paragraph joined by newlines; runs of spaces (column padding) become one.
    """
    lines = rendered.splitlines()
    body = [i for i, line in enumerate(lines) if line.strip()]
    if len(body) < 3:
        return []
    lines = lines[body[0] + 1:body[-1]]  # drop the header and footer line
    paragraphs: list[str] = []
    block: list[str] = []
    for line in [*lines, ""]:
        if not line.strip() or not line[0].isspace():  # blank, or a section heading
            if block:
                paragraphs.append("\n".join(block))
                block = []
            continue
        text = re.sub(r"[ \t\u00a0]{2,}", " ", line.strip())
        if unspaced:
            text = _JOIN_SPACE.sub("", text)
        block.append(text)
    return paragraphs


def man_to_prose(raw: bytes, unspaced: bool = False) -> list[str]:
    """Render one man page and strip it to paragraphs; [] for an alias stub."""
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if is_redirect(raw):
        return []
    return groff_to_prose(render(raw), unspaced)

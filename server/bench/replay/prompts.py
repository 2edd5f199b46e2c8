"""Prompt text for replayed requests: slices of committed held-out samples, so every head
tokenizes the same bytes (the trace gives sizes in bytes, not tokens). English comes from a
Wikipedia sample; other languages from heads/data/multilingual; code and documentation from
heads.corpus.content."""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from functools import cache

from heads.corpus.content import CONTENT_CLASSES, content_text
from heads.corpus.languages import sample
from heads.data.files import WIKI_SAMPLE_B
from heads.vocab.prompt_encoder import PromptEncoder
from router.simulate.engine import Spelling, Texts

SAMPLE = WIKI_SAMPLE_B  # held out from the bytes/token measurement (-a)
SPACED_SEARCH = 64  # characters to look ahead for a word start


class PromptText:
    def __init__(self, text: str | None = None, keep_whitespace: bool = False) -> None:
        raw = text or SAMPLE.read_text()
        # Prose becomes one line with no runs; code keeps its lines and indentation.
        self._text = raw if keep_whitespace else " ".join(raw.split())
        # _ends[i]: UTF-8 bytes of _text[:i + 1], to cut by bytes at character boundaries.
        ends, total = [], 0
        for ch in self._text:
            total += len(ch.encode())
            ends.append(total)
        self._ends = ends

    @property
    def whole(self) -> str:
        return self._text

    def _chars(self, start: int, n_bytes: int) -> int:
        """End index of the longest slice from `start` holding at most `n_bytes`."""
        base = self._ends[start - 1] if start else 0
        return max(start + 1, bisect.bisect_right(self._ends, base + n_bytes))

    def _start(self, index: int, span_bytes: int) -> int:
        span = self._chars(0, span_bytes) if span_bytes < self._ends[-1] else len(self._text)
        start = (index * 7919) % max(1, len(self._text) - span)
        space = self._text.find(" ", start)
        return space + 1 if 0 <= space < start + SPACED_SEARCH else start

    def text(self, n_bytes: int, index: int = 0) -> str:
        """About `n_bytes` of UTF-8, a different slice per index, starting at a word where the
        language has spaces."""
        start = self._start(index, n_bytes)
        return self._text[start:self._chars(start, n_bytes)]

    def pair(self, prompt_bytes: int, continuation_bytes: int, index: int) -> tuple[str, str]:
        """A prompt and the text that follows it in the sample (the held-out continuation
        a served head is scored on)."""
        start = self._start(index, prompt_bytes + continuation_bytes)
        cut = self._chars(start, prompt_bytes)
        return self._text[start:cut], self._text[cut:self._chars(cut, continuation_bytes)]


@cache
def for_language(lang: str) -> PromptText:
    """A language's held-out sample, or a content class's text (heads.corpus.content)."""
    if lang in CONTENT_CLASSES:
        return PromptText(content_text(lang), keep_whitespace=True)
    return PromptText() if lang == "en" else PromptText(sample(lang))


def spellings(encoder: PromptEncoder, langs: Iterable[str]) -> Texts:
    """How each head spells each language's sample: bytes/token and byte-fallback share, for
    the simulator (router.simulate.engine.Spelling)."""
    out: dict[str, dict[str, Spelling]] = {}
    for lang in langs:
        text = for_language(lang).whole
        enc = encoder.encode([text], chat=False)
        n = enc.prompt_bytes
        bos = encoder.bos_ids
        out[lang] = {h: Spelling(n / max(1, p.tokens - (bos.get(h) is not None)),
                                 p.fallback_bytes / n) for h, p in enc.heads.items()}
    return out

"""Prompt text for replayed requests: slices of a committed English sample, so every head
tokenizes the same bytes (the trace gives sizes in bytes, not tokens)."""

from __future__ import annotations

from heads.tokenizer_training import DATA_DIR

SAMPLE = DATA_DIR / "wiki-sample-b.txt"  # held out from the bytes/token measurement (-a)


class PromptText:
    def __init__(self, text: str | None = None) -> None:
        self._text = " ".join((text or SAMPLE.read_text()).split())  # one line, no runs

    def text(self, n_bytes: int, index: int = 0) -> str:
        """About `n_bytes` of text (ASCII-heavy English: chars ≈ bytes), a different slice
        per index, starting at a word."""
        n = max(1, min(n_bytes, len(self._text) - 1))
        start = (index * 7919) % (len(self._text) - n)
        space = self._text.find(" ", start)
        start = space + 1 if 0 <= space < start + 64 else start
        return self._text[start:start + n]

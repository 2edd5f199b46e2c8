"""Stop-string matching over an incremental text stream.

Text that could still be the start of a stop string is held back, so a client never sees
part of a stop sequence that is completed by the next token.
"""

from __future__ import annotations


class StopStringMatcher:
    def __init__(self, stops: list[str], include_stop: bool = False) -> None:
        self.stops = [s for s in stops if s]
        self.include_stop = include_stop  # the matched stop string ends the released text
        self._hold = max((len(s) for s in self.stops), default=1) - 1
        self._pending = ""
        self.matched: str | None = None

    def feed(self, text: str, armed: bool = True) -> str:
        """Add newly decoded text; return what can be released now. Unarmed (before
        min_tokens), nothing matches, but the tail a stop string could start with is held, so
        one completed by the next armed text still matches, as in vLLM."""
        if not self.stops:
            return text
        self._pending += text
        if not armed:
            out = self._pending[: max(0, len(self._pending) - self._hold)]
            self._pending = self._pending[len(out):]
            return out
        cut = min(
            (i for i in (self._pending.find(s) for s in self.stops) if i >= 0), default=-1
        )
        if cut >= 0:
            self.matched = next(s for s in self.stops if self._pending.find(s) == cut)
            end = cut + len(self.matched) if self.include_stop else cut
            out, self._pending = self._pending[:end], ""
            return out
        if len(self._pending) <= self._hold:
            return ""
        out = self._pending[: len(self._pending) - self._hold]
        self._pending = self._pending[len(out):]
        return out

    def flush(self) -> str:
        out, self._pending = self._pending, ""
        return out

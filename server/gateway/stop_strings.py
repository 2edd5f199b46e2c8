"""Stop-string matching over an incremental text stream.

Text that could still be the start of a stop string is held back, so a client never sees
part of a stop sequence that is completed by the next token.

Two kinds of stop: the client's `stop` strings, checked only once min_tokens tokens exist (as
vLLM does), and the chat layout's own next-turn markers (`turn`), which always end the reply
and never show in it: the client never asked to see them.
"""

from __future__ import annotations


class StopStringMatcher:
    def __init__(self, stops: list[str], include_stop: bool = False,
                 turn: tuple[str, ...] = ()) -> None:
        self.stops = [s for s in stops if s]
        self.turn = [s for s in turn if s]
        self.include_stop = include_stop  # a matched client stop string ends the released text
        self._hold = max((len(s) for s in (*self.stops, *self.turn)), default=1) - 1
        self._pending = ""
        self.matched: str | None = None

    def feed(self, text: str, armed: bool = True) -> str:
        """Add newly decoded text; return what can be released now. Unarmed (before
        min_tokens), only the turn markers match, but the tail a stop string could start
        with is held, so one completed by the next armed text still matches, as in vLLM."""
        if not self.stops and not self.turn:
            return text
        self._pending += text
        live = [*self.stops, *self.turn] if armed else self.turn
        cut = min((i for i in (self._pending.find(s) for s in live) if i >= 0), default=-1)
        if cut >= 0:
            self.matched = next(s for s in live if self._pending.find(s) == cut)
            keep = self.include_stop and self.matched in self.stops
            end = cut + len(self.matched) if keep else cut
            out, self._pending = self._pending[:end], ""
            return out
        out = self._pending[: max(0, len(self._pending) - self._hold)]
        self._pending = self._pending[len(out):]
        return out

    def flush(self) -> str:
        out, self._pending = self._pending, ""
        return out

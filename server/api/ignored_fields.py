"""Accepted-and-ignored request fields: the response header, and one log line per field."""

from __future__ import annotations

import logging

from server.schemas import SamplingFields

log = logging.getLogger(__name__)

HEADER = "x-polyhead-ignored-fields"


class IgnoredFields:
    """Logs each ignored field the first time any request sends it (a busy gateway would
    otherwise log the same line per request); one per app."""

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def headers(self, body: SamplingFields) -> dict[str, str]:
        fields = body.ignored_fields()
        new = [f for f in fields if f not in self._seen]
        if new:
            self._seen.update(new)
            log.warning("ignoring request field(s) %s: they do not change generation "
                        "(logged once per field)", ", ".join(new))
        return {HEADER: ", ".join(fields)} if fields else {}

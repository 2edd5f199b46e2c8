"""Append-only audit trail of admin changes: one JSON object per line.

Fields: ts (UTC ISO-8601), actor (the admin token's name, never the token), action,
before, after. Each record is one O_APPEND write, so concurrent writers never interleave.
"""

from __future__ import annotations

import json
import os
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


class AuditLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def append(self, actor: str, action: str, before: Any, after: Any) -> dict[str, Any]:
        record = {"ts": datetime.now(UTC).isoformat(timespec="milliseconds"), "actor": actor,
                  "action": action, "before": before, "after": after}
        line = (json.dumps(record, ensure_ascii=False, sort_keys=True) + "\n").encode()
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
        return record

    def tail(self, n: int = 50) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        lines = self.path.read_text().splitlines()[-n:]
        return [json.loads(line) for line in lines]

"""Persistence of λ's counters across restarts and replicas: served bytes/tokens per head and
the operator's forecast λ, behind a small `Store` seam.

- `FileStore` (the single-replica default): one JSON file, rewritten atomically (temp file
  in the same directory, fsync, os.replace), so a crash leaves the old or the new file.
- `MemoryStore`: tests and the simulator.
- Each store also keeps the active routing policy (`PolicyRecord`), written only if its
  version is newer than the stored one, so a stale replica never overwrites a newer policy.
- A Redis store lives in server/ (it needs the redis client); replicas share its counters.

`StateSync` moves a LiveState's increments into a store and pulls the other replicas' back:
each flush adds the local delta since the last flush, then rebases the local counters on
the store's totals, keeping any increments that arrived meanwhile.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from router.state import LiveState

if TYPE_CHECKING:
    from router.router import Router

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Counters:
    served_bytes: Mapping[str, int] = field(default_factory=dict)
    served_tokens: Mapping[str, int] = field(default_factory=dict)
    lambda_forecast: float | None = None


@dataclass(frozen=True, slots=True)
class PolicyRecord:
    doc: dict[str, Any]
    version: int
    changed_by: str
    changed_at: float

    def to_json(self) -> dict[str, Any]:
        return {"doc": self.doc, "version": self.version, "changed_by": self.changed_by,
                "changed_at": self.changed_at}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PolicyRecord:
        return cls(dict(d["doc"]), int(d["version"]), str(d["changed_by"]),
                   float(d["changed_at"]))


class Store(Protocol):
    def load(self) -> Counters: ...

    def add(self, served_bytes: Mapping[str, int], served_tokens: Mapping[str, int]) -> None:
        """Increment the persisted counters atomically."""
        ...

    def set_forecast(self, lam: float | None) -> None: ...

    def load_policy(self) -> PolicyRecord | None: ...

    def save_policy(self, rec: PolicyRecord) -> bool:
        """Store `rec` only if its version is newer than the stored one; False otherwise."""
        ...


def _plus(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    return {k: int(a.get(k, 0)) + int(b.get(k, 0)) for k in {*a, *b}}


class MemoryStore:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._c = Counters()
        self._policy: PolicyRecord | None = None

    def load(self) -> Counters:
        return self._c

    def add(self, served_bytes: Mapping[str, int], served_tokens: Mapping[str, int]) -> None:
        with self._lock:
            c = self._c
            self._c = Counters(_plus(c.served_bytes, served_bytes),
                               _plus(c.served_tokens, served_tokens), c.lambda_forecast)

    def set_forecast(self, lam: float | None) -> None:
        with self._lock:
            self._c = Counters(self._c.served_bytes, self._c.served_tokens, lam)

    def load_policy(self) -> PolicyRecord | None:
        return self._policy

    def save_policy(self, rec: PolicyRecord) -> bool:
        with self._lock:
            if self._policy is not None and self._policy.version >= rec.version:
                return False
            self._policy = rec
            return True


class FileStore:
    """JSON at `path`: {"served_bytes": {...}, "served_tokens": {...}, "lambda_forecast": x};
    the policy record beside it, at `<stem>.policy.json`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.policy_path = path.with_name(path.stem + ".policy.json")
        self._lock = threading.Lock()

    def load(self) -> Counters:
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            return Counters()
        except (OSError, ValueError) as e:
            # A corrupt file must not keep the gateway down; λ restarts from 0 and says so.
            log.error("λ store %s unreadable (%s); starting from zero", self.path, e)
            return Counters()
        forecast = doc.get("lambda_forecast")
        return Counters({k: int(v) for k, v in doc.get("served_bytes", {}).items()},
                        {k: int(v) for k, v in doc.get("served_tokens", {}).items()},
                        None if forecast is None else float(forecast))

    def _write(self, c: Counters) -> None:
        _write_atomic(self.path, {"served_bytes": dict(c.served_bytes),
                                  "served_tokens": dict(c.served_tokens),
                                  "lambda_forecast": c.lambda_forecast})

    def load_policy(self) -> PolicyRecord | None:
        try:
            return PolicyRecord.from_json(json.loads(self.policy_path.read_text()))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.error("policy store %s unreadable (%s); using the configured policy",
                      self.policy_path, e)
            return None

    def save_policy(self, rec: PolicyRecord) -> bool:
        with self._lock:
            cur = self.load_policy()
            if cur is not None and cur.version >= rec.version:
                return False
            _write_atomic(self.policy_path, rec.to_json())
            return True
    def add(self, served_bytes: Mapping[str, int], served_tokens: Mapping[str, int]) -> None:
        with self._lock:
            c = self.load()
            self._write(Counters(_plus(c.served_bytes, served_bytes),
                                 _plus(c.served_tokens, served_tokens), c.lambda_forecast))

    def set_forecast(self, lam: float | None) -> None:
        with self._lock:
            c = self.load()
            self._write(Counters(c.served_bytes, c.served_tokens, lam))


def _write_atomic(path: Path, doc: Mapping[str, Any]) -> None:
    """Temp file in the same directory, fsync, os.replace: a crash leaves old or new."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class StateSync:
    """Flushes a LiveState's served counters into a Store and pulls the shared totals back."""

    def __init__(self, state: LiveState, store: Store) -> None:
        self.state = state
        self.store = store
        self._lock = threading.Lock()
        self._base = Counters()  # what the store held, as folded into the state, last time

    def restore(self) -> Counters:
        """At startup: the state takes the store's totals and forecast."""
        with self._lock:
            c = self.store.load()
            self.state.restore_served(c.served_bytes, c.served_tokens)
            self.state.set_lambda_forecast(c.lambda_forecast)
            self._base = c
        log.info("restored λ counters: %d served bytes, forecast %s",
                 sum(c.served_bytes.values()), c.lambda_forecast)
        return c

    def flush(self) -> None:
        """Push the local increments since the last flush; raises if the store fails (the
        increments stay local and go out with the next flush)."""
        with self._lock:
            snap = self.state.snapshot()
            base = self._base
            d_bytes = {h: v - base.served_bytes.get(h, 0) for h, v in snap.served_bytes.items()}
            d_tokens = {h: v - base.served_tokens.get(h, 0)
                        for h, v in snap.served_tokens.items()}
            if any(d_bytes.values()) or any(d_tokens.values()):
                self.store.add({h: v for h, v in d_bytes.items() if v},
                               {h: v for h, v in d_tokens.items() if v})
                # Pushed: a failing load below must not push the same delta twice.
                self._base = Counters(snap.served_bytes, snap.served_tokens,
                                      base.lambda_forecast)
            fresh = self.store.load()
            # Local value = store total + what arrived after the snapshot.
            self.state.rebase_served(snap.served_bytes, snap.served_tokens,
                                     fresh.served_bytes, fresh.served_tokens)
            self.state.set_lambda_forecast(fresh.lambda_forecast)
            self._base = Counters(
                {h: fresh.served_bytes.get(h, 0) for h in snap.served_bytes},
                {h: fresh.served_tokens.get(h, 0) for h in snap.served_tokens},
                fresh.lambda_forecast)

    def set_forecast(self, lam: float | None) -> None:
        self.state.set_lambda_forecast(lam)
        self.store.set_forecast(lam)


class PolicySync:
    """Keeps a Router's active policy and a Store's policy record in step: the newer version
    wins. `on_change` runs after the router adopts a policy from the store."""

    def __init__(self, router: Router, store: Store,
                 on_change: Callable[[], None] | None = None) -> None:
        self.router = router
        self.store = store
        self.on_change = on_change
        self._lock = threading.Lock()

    def _record(self) -> PolicyRecord:
        r = self.router
        return PolicyRecord(r.policy_doc, r.version, r.changed_by, r.changed_at)

    def _adopt(self, rec: PolicyRecord, force: bool = False, keep_history: bool = True) -> bool:
        adopted = self.router.adopt(rec.doc, rec.version, rec.changed_by, rec.changed_at,
                                    force=force, keep_history=keep_history)
        if adopted and self.on_change is not None:
            self.on_change()
        return adopted

    def restore(self) -> PolicyRecord | None:
        """At startup: the persisted policy, if any, replaces the configured first-boot one."""
        with self._lock:
            rec = self.store.load_policy()
            if rec is not None:
                self._adopt(rec, force=True, keep_history=False)
                log.info("restored policy v%d (set by %s)", rec.version, rec.changed_by)
            return rec

    def push(self) -> PolicyRecord | None:
        """After a local change: store it. If another replica stored a version at least as new
        first, adopt that one and return it (the local change lost); else None."""
        with self._lock:
            if self.store.save_policy(self._record()):
                return None
            winner = self.store.load_policy()
            if winner is not None:
                self._adopt(winner, force=True)
            return winner

    def pull(self) -> bool:
        """Version check: adopt a newer stored policy, or store a newer local one (a save that
        failed earlier). Returns whether the router changed."""
        with self._lock:
            rec = self.store.load_policy()
            if rec is not None and rec.version > self.router.version:
                return self._adopt(rec)
            if self.router.version > (rec.version if rec is not None else 1):
                self.store.save_policy(self._record())
            return False

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

import dataclasses
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
    # Finished requests' output per "head/script" (router.compression), summed like λ's.
    output_bytes: Mapping[str, int] = field(default_factory=dict)
    output_tokens: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Increments:
    """What one flush adds to a store: every counter's delta since the last flush."""

    served_bytes: Mapping[str, int] = field(default_factory=dict)
    served_tokens: Mapping[str, int] = field(default_factory=dict)
    output_bytes: Mapping[str, int] = field(default_factory=dict)
    output_tokens: Mapping[str, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return any(any(m.values()) for m in (self.served_bytes, self.served_tokens,
                                             self.output_bytes, self.output_tokens))

    def added_to(self, c: Counters) -> Counters:
        return Counters(_plus(c.served_bytes, self.served_bytes),
                        _plus(c.served_tokens, self.served_tokens), c.lambda_forecast,
                        _plus(c.output_bytes, self.output_bytes),
                        _plus(c.output_tokens, self.output_tokens))


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

    def add(self, inc: Increments) -> None:
        """Increment the persisted counters atomically."""
        ...

    def set_forecast(self, lam: float | None) -> None: ...

    def load_policy(self) -> PolicyRecord | None: ...

    def save_policy(self, rec: PolicyRecord) -> bool:
        """Store `rec` only if its version is newer than the stored one; False otherwise."""
        ...


def _plus(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    return {k: int(a.get(k, 0)) + int(b.get(k, 0)) for k in {*a, *b}}


def _minus(now: Mapping[str, int], base: Mapping[str, int]) -> dict[str, int]:
    """The non-zero increments of `now` over `base`."""
    return {k: d for k, v in now.items() if (d := int(v) - int(base.get(k, 0)))}


class MemoryStore:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._c = Counters()
        self._policy: PolicyRecord | None = None

    def load(self) -> Counters:
        return self._c

    def add(self, inc: Increments) -> None:
        with self._lock:
            self._c = inc.added_to(self._c)

    def set_forecast(self, lam: float | None) -> None:
        with self._lock:
            self._c = dataclasses.replace(self._c, lambda_forecast=lam)

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

        def ints(key: str) -> dict[str, int]:
            return {k: int(v) for k, v in doc.get(key, {}).items()}

        return Counters(ints("served_bytes"), ints("served_tokens"),
                        None if forecast is None else float(forecast),
                        ints("output_bytes"), ints("output_tokens"))

    def _write(self, c: Counters) -> None:
        _write_atomic(self.path, {"served_bytes": dict(c.served_bytes),
                                  "served_tokens": dict(c.served_tokens),
                                  "lambda_forecast": c.lambda_forecast,
                                  "output_bytes": dict(c.output_bytes),
                                  "output_tokens": dict(c.output_tokens)})

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
    def add(self, inc: Increments) -> None:
        with self._lock:
            self._write(inc.added_to(self.load()))

    def set_forecast(self, lam: float | None) -> None:
        with self._lock:
            self._write(dataclasses.replace(self.load(), lambda_forecast=lam))


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
            self.state.restore_output(c.output_bytes, c.output_tokens)
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
            inc = Increments(_minus(snap.served_bytes, base.served_bytes),
                             _minus(snap.served_tokens, base.served_tokens),
                             _minus(snap.output_bytes, base.output_bytes),
                             _minus(snap.output_tokens, base.output_tokens))
            if inc:
                self.store.add(inc)
                # Pushed: a failing load below must not push the same delta twice.
                self._base = Counters(snap.served_bytes, snap.served_tokens,
                                      base.lambda_forecast, snap.output_bytes,
                                      snap.output_tokens)
            fresh = self.store.load()
            # Local value = store total + what arrived after the snapshot.
            self.state.rebase_served(snap.served_bytes, snap.served_tokens,
                                     fresh.served_bytes, fresh.served_tokens)
            self.state.restore_output(fresh.output_bytes, fresh.output_tokens,
                                      snap.output_bytes, snap.output_tokens)
            self.state.set_lambda_forecast(fresh.lambda_forecast)
            self._base = Counters(
                {h: fresh.served_bytes.get(h, 0) for h in snap.served_bytes},
                {h: fresh.served_tokens.get(h, 0) for h in snap.served_tokens},
                fresh.lambda_forecast, dict(fresh.output_bytes), dict(fresh.output_tokens))

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

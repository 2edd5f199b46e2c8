"""The vLLM backend's replica set: which engines exist (fixed, or from discovery), which are
up (health polls), how loaded each is, and which one a request goes to."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Sequence

from server.backends.vllm.signals import EngineSignals
from server.backends.vllm.types import Discovery, Replica
from server.ops.engine_metrics import ReplicaStats

log = logging.getLogger(__name__)


class ReplicaSet:
    def __init__(self, replicas: Sequence[Replica], poll_interval_s: float = 2.0,
                 discovery: Discovery | None = None) -> None:
        self.replicas = list(replicas)
        self.poll_interval_s = poll_interval_s
        self.discovery = discovery  # None: a fixed replica set
        self._retired: list[Replica] = []  # gone from discovery, streams still in flight
        self.inflight: Counter[str] = Counter()  # per replica
        self.failovers: Counter[str] = Counter()  # replica -> requests moved away from it
        self.lost_streams: Counter[str] = Counter()  # replica -> streams cut mid-way
        self._poller: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await asyncio.gather(*(r.start() for r in self.replicas))
        await self.rediscover()
        self._poller = asyncio.create_task(self._poll_forever(), name="vllm-health")

    async def stop(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        await asyncio.gather(*(r.stop() for r in [*self.replicas, *self._retired]),
                             return_exceptions=True)
        if self.discovery is not None:
            await self.discovery.close()

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval_s)
            try:
                await self.rediscover()
                await asyncio.gather(*(r.poll() for r in self.replicas))
            except Exception:  # the poller must outlive any one bad round
                log.exception("vLLM health poll failed; retrying next interval")

    async def rediscover(self) -> None:
        """Match the replicas to what discovery sees. A vanished replica only leaves the
        routing set: it is stopped once its in-flight requests end, so no stream is cut."""
        found = self.discovery
        urls = await found.discover() if found is not None else None
        if found is not None and urls is not None:
            for r in [r for r in self.replicas if r.name not in urls]:
                log.info("vLLM engine %s left discovery; retiring it", r.name)
                self.replicas.remove(r)
                self._retired.append(r)
            known = {r.name for r in self.replicas}
            for url in sorted(urls - known):
                back = next((r for r in self._retired if r.name == url), None)
                if back is not None:
                    self._retired.remove(back)  # returned before it drained: reuse it
                else:
                    back = found.make(url)
                    await back.start()
                log.info("vLLM engine %s discovered", url)
                self.replicas.append(back)
        drained = [r for r in self._retired if self.inflight[r.name] == 0]
        for r in drained:
            self._retired.remove(r)
            await r.stop()

    def pick(self, head: str, tried: set[str]) -> Replica | None:
        live = [r for r in self.replicas if r.up and head in r.heads and r.name not in tried]
        # Least loaded: the gateway's own in-flight count is current; vLLM's gauges lag a poll.
        return min(live, key=lambda r: (self.inflight[r.name], r.signals.kv_usage), default=None)

    def live_signals(self) -> list[EngineSignals]:
        return [r.signals for r in self.replicas if r.up]

    def stats(self) -> list[ReplicaStats]:
        return [
            ReplicaStats(r.name, r.up, r.signals.running, r.signals.waiting, r.signals.kv_usage,
                         self.failovers[r.name], self.lost_streams[r.name])
            for r in self.replicas
        ]

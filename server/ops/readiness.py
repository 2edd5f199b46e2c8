"""Readiness of the gateway: starting, ready, draining."""

from __future__ import annotations

import enum


class Phase(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"


class Lifecycle:
    def __init__(self) -> None:
        self.phase = Phase.STARTING

    @property
    def ready(self) -> bool:
        return self.phase is Phase.READY

    @property
    def draining(self) -> bool:
        return self.phase is Phase.DRAINING

"""Fixtures shared by the gateway tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.redis_util import RedisServer


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A real redis-server on a free loopback port, stopped after the test."""
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()

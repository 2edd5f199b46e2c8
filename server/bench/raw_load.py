"""A closed-loop HTTP/1.1 load generator on raw asyncio streams, for max req/s.

httpx spends ~1 ms of this process's CPU per request, so on a small machine a closed loop
through it measures the client, not the gateway. Here each connection writes one pre-encoded
request and reads the status line, the headers and a Content-Length body: keep-alive, no
pipelining, tens of µs per request.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(frozen=True, slots=True)
class LoadResult:
    ok: int
    errors: int
    seconds: float
    latencies_s: list[float]
    cpu_s: float | None  # the server's CPU seconds over the timed window, when measured


def post_bytes(host: str, port: int, path: str, body: dict) -> bytes:
    payload = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(payload)}\r\n\r\n")
    return head.encode() + payload


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    request: bytes) -> int:
    """One request on a kept-alive connection; its HTTP status."""
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    if length:
        await reader.readexactly(length)
    return status


async def closed_loop_raw(url: str, path: str, body: dict, concurrency: int, seconds: float,
                          server_cpu: Callable[[], float] | None = None) -> LoadResult:
    """`concurrency` connections, each sending the next request when the last one answered.
    `server_cpu`: the server's CPU seconds so far, read when the timed window opens and shuts
    (after every connection's warm-up)."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    request = post_bytes(host, port, path, body)
    ok = errors = 0
    lat: list[float] = []
    warm = 0
    go = asyncio.Event()
    start = stop = 0.0
    cpu0: float | None = None

    async def connection() -> None:
        nonlocal ok, errors, warm, start, stop, cpu0
        reader, writer = await asyncio.open_connection(host, port)
        try:
            for _ in range(20):  # connection and code-path warm-up, untimed
                await _exchange(reader, writer, request)
            warm += 1
            if warm == concurrency:  # the last one warm opens the timed window
                cpu0 = server_cpu() if server_cpu else None
                start = time.perf_counter()
                stop = start + seconds
                go.set()
            await go.wait()
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                if await _exchange(reader, writer, request) == 200:
                    ok += 1
                    lat.append(time.perf_counter() - t0)
                else:
                    errors += 1
        finally:
            writer.close()

    await asyncio.gather(*(connection() for _ in range(concurrency)))
    took = time.perf_counter() - start
    cpu = server_cpu() - cpu0 if server_cpu is not None and cpu0 is not None else None
    return LoadResult(ok, errors, took, lat, cpu)

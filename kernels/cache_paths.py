"""Where polyhead keeps its caches: $POLYHEAD_CACHE_DIR, else ~/.cache/polyhead.

Pure Python, no polyhead imports, so kernels, heads and server can all resolve their cache
directories here.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "POLYHEAD_CACHE_DIR"


def default_cache_root() -> Path:
    """~/.cache/polyhead, whatever the environment says (the gateway settings read
    POLYHEAD_CACHE_DIR through their own env prefix)."""
    return Path.home() / ".cache" / "polyhead"


def cache_root(expand_user: bool = False) -> Path:
    """$POLYHEAD_CACHE_DIR when set and non-empty (`~` expanded only with `expand_user`),
    else ~/.cache/polyhead."""
    env = os.environ.get(ENV_VAR)
    if not env:
        return default_cache_root()
    return Path(env).expanduser() if expand_user else Path(env)


def models_dir(root: Path | None = None) -> Path:
    return (root or cache_root()) / "models"


def gguf_dir(root: Path | None = None) -> Path:
    return (root or cache_root()) / "gguf"


def downloads_dir(root: Path | None = None) -> Path:
    return (root or cache_root()) / "downloads"


def corpus_dir(root: Path | None = None) -> Path:
    return (root or cache_root()) / "corpus"


def calibration_dir(root: Path | None = None) -> Path:
    return (root or cache_root()) / "calibration"


def native_dir(root: Path | None = None) -> Path:
    return (root or cache_root()) / "native"

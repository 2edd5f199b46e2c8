"""Where the served checkpoint comes from: a directory, or a named model built on demand."""

from __future__ import annotations

import logging
from pathlib import Path

from heads.errors import CheckpointError
from heads.manifest import MANIFEST_FILE
from heads.tiny import build_tiny

log = logging.getLogger(__name__)

BUILT_IN = ("tiny",)


def resolve_model_dir(model: str, cache_dir: Path) -> Path:
    """`tiny` is built into the cache on first use; anything else must be a checkpoint dir."""
    if model in BUILT_IN:
        target = cache_dir / "models" / model
        if not (target / MANIFEST_FILE).is_file():
            log.info("building the %s model into %s (first run)", model, target)
            build_tiny(target)
        return target
    path = Path(model).expanduser()
    if not path.is_dir():
        raise CheckpointError(
            f"model {model!r} is neither a built-in ({', '.join(BUILT_IN)}) nor a directory"
        )
    return path

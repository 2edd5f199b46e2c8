"""Pick the loader for a source string: a .gguf file, our checkpoint dir, or an HF dir / hub ID."""

from __future__ import annotations

from pathlib import Path

from heads.loaders.source import LoadedSource
from heads.manifest import MANIFEST_FILE


def load_source(source: str, dtype: str = "bfloat16") -> LoadedSource:
    path = Path(source).expanduser()
    if path.suffix == ".gguf":
        from heads.loaders.gguf import load_gguf

        return load_gguf(path, dtype)
    if (path / MANIFEST_FILE).is_file():
        from heads.loaders.native import load_native

        return load_native(path)
    from heads.loaders.hf import load_hf

    return load_hf(source, dtype)

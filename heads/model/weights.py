"""A checkpoint's tensors: load them into a MultiHeadModel, and write a checkpoint atomically.

The directory layout and the torch-free checks are in heads/checkpoint.py.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from heads.checkpoint import check_weights, load_tokenizers, validate_checkpoint
from heads.errors import CheckpointError
from heads.manifest import Manifest
from heads.model.multi_head import MultiHeadModel
from heads.model.native import build as native_build
from heads.vocab.tokenizer import HeadTokenizer
from kernels.int_groups import IntGroups

log = logging.getLogger(__name__)

# The source file's own quantised values beside the dequantised weights (kernels.int_groups),
# named in the manifest's extra["int_groups"] with their sha256.
INT_GROUPS_FILE = "int_groups.safetensors"


@dataclass(frozen=True)
class Checkpoint:
    directory: Path
    manifest: Manifest
    model: MultiHeadModel
    tokenizers: dict[str, HeadTokenizer]

    def with_readings(self, heads: Sequence[str]) -> Checkpoint:
        """The checkpoint as served with these split heads' two-level readings as heads of
        their own (Manifest.with_readings): each encodes with the native tokenizer. The
        engine that serves them takes their groups (heads/engine/grouped_reading.py)."""
        if not heads:
            return self
        manifest = self.manifest.with_readings(heads)
        native = self.manifest.native.name
        tokenizers = {**self.tokenizers, **{h.name: self.tokenizers[native]
                                            for h in manifest.heads if h.reads is not None}}
        return replace(self, manifest=manifest, tokenizers=tokenizers)


def load_checkpoint(
    directory: Path, device: str = "cpu", compute_dtype: str | None = None, int8: bool = False
) -> Checkpoint:
    """`int8`: also load the stored integer groups, where the checkpoint has them, into
    `model.int8` (by tensor name) for the engine's quantised products."""
    manifest = check_weights(directory)
    # Tokenizers load once, here (a 262k-token tokenizer takes seconds to build).
    tokenizers = load_tokenizers(directory, manifest)
    tensors: dict[str, torch.Tensor] = {}
    with safe_open(str(directory / manifest.weights), framework="pt", device=device) as f:
        for k in f.keys():  # noqa: SIM118
            tensors[k] = f.get_tensor(k)
    tensors.update(load_adapter_tensors(directory, manifest, device))
    model = MultiHeadModel(manifest, tensors, compute_dtype)
    if int8 and device == "cpu":
        model.int8 = load_int_groups(directory, manifest)
    if device == "cpu" and hasattr(model.backbone, "fused_ops"):
        # Inference outside the engine (evaluation, scoring) computes as the engine serves.
        setattr(model.backbone, "fused_ops", native_build.load())  # noqa: B010
    return Checkpoint(directory, manifest, model, tokenizers)


def load_adapter_tensors(directory: Path, manifest: Manifest, device: str = "cpu"
                         ) -> dict[str, torch.Tensor]:
    """Every adapted head's tensors (fp32), read from their sidecar files."""
    out: dict[str, torch.Tensor] = {}
    for h in manifest.heads:
        for _, adapter in h.adapters():
            with safe_open(str(directory / adapter.file), framework="pt", device=device) as f:
                out.update({k: f.get_tensor(k) for k in adapter.names()})
    return out


def load_int_groups(directory: Path, manifest: Manifest) -> dict[str, IntGroups]:
    """The checkpoint's integer groups by tensor name ({} where it has none), checked against
    the sha256 its manifest records."""
    meta = manifest.extra.get("int_groups")
    if not meta:
        return {}
    path = directory / meta["file"]
    if not path.is_file() or _sha256(path) != meta["sha256"]:
        raise CheckpointError(f"{path}: missing, or not the file the manifest's sha256 names")
    with safe_open(str(path), framework="pt") as f:
        return IntGroups.from_tensors({k: f.get_tensor(k) for k in f.keys()})  # noqa: SIM118


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_checkpoint(
    directory: Path,
    manifest: Manifest,
    tensors: dict[str, torch.Tensor],
    tokenizer_json: Mapping[str, str | bytes],
    int8: Mapping[str, IntGroups] | None = None,
) -> None:
    """Write atomically. `tokenizer_json` maps each head's `tokenizer` path to its JSON text
    (and each `split_table` path to the table's bytes); `int8`, the source's quantised
    values by tensor name, goes to INT_GROUPS_FILE, named with its sha256 in extra["int_groups"]."""
    manifest.validate()
    named = [p for h in manifest.heads for p in (h.tokenizer, h.split_table) if p is not None]
    missing = [p for p in named if p not in tokenizer_json]
    if missing:
        raise CheckpointError(f"tokenizer file {missing[0]!r} named by a head was not given")
    directory = directory.resolve()
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        if int8:
            flat = {k: v.contiguous() for name, g in int8.items()
                    for k, v in g.to_tensors(name).items()}
            save_file(flat, str(tmp / INT_GROUPS_FILE))
            manifest = replace(manifest, extra={**manifest.extra, "int_groups": {
                "file": INT_GROUPS_FILE, "sha256": _sha256(tmp / INT_GROUPS_FILE),
                "tensors": len(int8)}})
        else:
            manifest = replace(manifest, extra={k: v for k, v in manifest.extra.items()
                                                if k != "int_groups"})
        manifest.save(tmp)
        # safetensors refuses shared storage; tied matrices are stored once by name already.
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / manifest.weights))
        for rel, text in tokenizer_json.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            if isinstance(text, bytes):
                (tmp / rel).write_bytes(text)
            else:
                (tmp / rel).write_text(text, encoding="utf-8")
        validate_checkpoint(tmp)
        if directory.exists():
            old = directory.with_name(f".{directory.name}.old-{os.getpid()}")
            directory.rename(old)
            tmp.rename(directory)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("wrote checkpoint %s", directory)

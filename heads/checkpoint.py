"""Read, write and check polyhead checkpoint directories.

Layout:
    manifest.json            format version, backbone config, dtype, heads
    model.safetensors        backbone.* tensors and the shared head matrices
    tokenizers/<head>.json   one HF tokenizers file per head
    adapters/*.safetensors   adapted heads' tensors, one file per head (HeadSpec.adapter)
    tokenizers/<head>.split.npz  boundary-preserving heads only: see heads/split_table.py

Writes go to a temporary sibling directory that is renamed into place, so a crash or a full
disk never leaves a half-written model behind.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from heads.errors import CheckpointError, TokenizerError
from heads.manifest import Manifest
from heads.model import MultiHeadModel
from heads.split_table import SplitTable
from heads.tokenizer import HeadTokenizer, vocab_fingerprint

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Checkpoint:
    directory: Path
    manifest: Manifest
    model: MultiHeadModel
    tokenizers: dict[str, HeadTokenizer]


def _tensor_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    if not path.is_file():
        raise CheckpointError(f"weights: {path} is missing")
    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"weights: {path} is not a readable safetensors file ({e})") from e


def _load_tokenizers(directory: Path, manifest: Manifest) -> dict[str, HeadTokenizer]:
    out: dict[str, HeadTokenizer] = {}
    by_file: dict[str, HeadTokenizer] = {}  # one load per tokenizer file (262k takes seconds)
    # Heads that encode on their own first: a boundary-preserving head reuses one of them.
    for i, h in sorted(enumerate(manifest.heads), key=lambda ih: ih[1].split_table is not None):
        path = directory / h.tokenizer
        if not path.is_file():
            raise CheckpointError(f"heads[{i}].tokenizer: {path} is missing")
        try:
            tok = HeadTokenizer.from_file(path, h.vocab_size)
            if h.split_table is not None and h.encoder is not None:
                tok = _with_split(directory, h.encoder, h.split_table, tok, by_file)
        except TokenizerError as e:
            raise CheckpointError(f"heads[{i}].tokenizer: {e}") from e
        by_file.setdefault(h.tokenizer, tok)
        out[h.name] = tok
    return {h.name: out[h.name] for h in manifest.heads}


def _with_split(directory: Path, encoder: str, table: str, tok: HeadTokenizer,
                loaded: dict[str, HeadTokenizer]) -> HeadTokenizer:
    """`tok` encoding through the native tokenizer `encoder` and the split table `table`."""
    split = SplitTable.load(directory / table)
    native = loaded.get(encoder)
    if native is None or native.split is not None:
        native = HeadTokenizer.from_file(directory / encoder, split.native_size)
    if vocab_fingerprint(native.tokenizer) != split.encoder_sha256:
        raise TokenizerError(f"{table}: built for another tokenizer than {encoder}")
    return replace(tok, split=split, encoder=native)


def validate_checkpoint(directory: Path) -> Manifest:
    """Check a checkpoint without loading its weights: manifest, tensor names/shapes, tokenizers."""
    manifest = _validate_weights(directory)
    _load_tokenizers(directory, manifest)
    return manifest


def _validate_weights(directory: Path) -> Manifest:
    """The manifest, checked against the tensor names and shapes in the weights file."""
    manifest = Manifest.load(directory)
    shapes = _tensor_shapes(directory / manifest.weights)
    d = manifest.backbone.hidden_size
    for i, h in enumerate(manifest.heads):
        for role in ("embedding", "unembedding"):
            name = getattr(h, role)
            shape = shapes.get(name)
            if shape is None:
                raise CheckpointError(f"heads[{i}].{role}: tensor {name!r} not in the weights")
            if len(shape) != 2 or shape[1] != d or shape[0] < h.vocab_size:
                raise CheckpointError(
                    f"heads[{i}].{role}: tensor {name!r} has shape {shape}, "
                    f"need [>= {h.vocab_size}, {d}]"
                )
        if h.adapter is not None:
            sidecar = _tensor_shapes(directory / h.adapter.file)
            for name, need in h.adapter.shapes(h.vocab_size, d).items():
                if sidecar.get(name) != need:
                    raise CheckpointError(f"heads[{i}].adapter: tensor {name!r} has shape "
                                          f"{sidecar.get(name)}, need {need}")
    return manifest


def load_metadata(directory: Path) -> tuple[Manifest, dict[str, HeadTokenizer]]:
    """The manifest and tokenizers without the weights: all a gateway in front of a remote
    or vLLM engine needs (the shapes are still checked against the weights file)."""
    manifest = _validate_weights(directory)
    return manifest, _load_tokenizers(directory, manifest)


def load_checkpoint(
    directory: Path, device: str = "cpu", compute_dtype: str | None = None
) -> Checkpoint:
    manifest = _validate_weights(directory)
    # Tokenizers load once, here (a 262k-token tokenizer takes seconds to build).
    tokenizers = _load_tokenizers(directory, manifest)
    tensors: dict[str, torch.Tensor] = {}
    with safe_open(str(directory / manifest.weights), framework="pt", device=device) as f:
        for k in f.keys():  # noqa: SIM118
            tensors[k] = f.get_tensor(k)
    tensors.update(load_adapter_tensors(directory, manifest, device))
    model = MultiHeadModel(manifest, tensors, compute_dtype)
    return Checkpoint(directory, manifest, model, tokenizers)


def load_adapter_tensors(directory: Path, manifest: Manifest, device: str = "cpu"
                         ) -> dict[str, torch.Tensor]:
    """Every adapted head's tensors (fp32), read from their sidecar files."""
    out: dict[str, torch.Tensor] = {}
    for h in manifest.heads:
        if h.adapter is not None:
            with safe_open(str(directory / h.adapter.file), framework="pt", device=device) as f:
                out.update({k: f.get_tensor(k) for k in h.adapter.names()})
    return out


def save_checkpoint(
    directory: Path,
    manifest: Manifest,
    tensors: dict[str, torch.Tensor],
    tokenizer_json: Mapping[str, str | bytes],
) -> None:
    """Write atomically. `tokenizer_json` maps each head's `tokenizer` path to its JSON text
    (and each `split_table` path to the table's bytes)."""
    manifest.validate()
    named = [p for h in manifest.heads for p in (h.tokenizer, h.split_table) if p is not None]
    missing = [p for p in named if p not in tokenizer_json]
    if missing:
        raise CheckpointError(f"tokenizer file {missing[0]!r} named by a head was not given")
    directory = directory.resolve()
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
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


def describe_checkpoint(directory: Path) -> str:
    """A human-readable summary for `polyhead heads inspect`."""
    m = validate_checkpoint(directory)
    b = m.backbone
    shapes = _tensor_shapes(directory / m.weights)
    total = sum(int(torch.Size(s).numel()) for s in shapes.values())
    lines = [
        f"model       {m.model_name}  (format v{m.format_version}, {m.dtype})",
        f"backbone    {b.architecture}: d={b.hidden_size} layers={b.num_layers} "
        f"heads={b.num_heads}/{b.num_kv_heads} head_dim={b.head_dim} ffn={b.intermediate_size}",
        f"parameters  {total:,} stored ({b.num_parameters():,} in the backbone)",
        f"chat        {'model template' if m.chat_template else 'plain fallback template'}",
        "",
        f"{'head':<8}{'V':>9}  {'matrix (rows)':<28}{'bytes/tok':>10}{'BPB':>8}{'train bytes':>14}",
    ]
    for h in m.heads:
        tied = h.embedding == h.unembedding
        matrix = f"{h.unembedding}{'' if tied else ' (untied)'} [:{h.vocab_size}]"
        bpt = "-" if h.bytes_per_token is None else f"{h.bytes_per_token:.3f}"
        bpb = "-" if h.bpb is None else f"{h.bpb:.3f}"
        lines.append(
            f"{h.name:<8}{h.vocab_size:>9}  {matrix:<28}{bpt:>10}{bpb:>8}{h.training_bytes:>14,}"
        )
    for h in m.heads:
        a = h.adapter
        if a is not None:
            lines.append(f"adapter {h.name}: {a.kind} r={a.rank}, {a.steps} steps on "
                         f"{a.train_positions:,} positions, held-out BPB "
                         f"{a.heldout_bpb_before} -> {a.heldout_bpb_after} ({a.file})")
    return "\n".join(lines)

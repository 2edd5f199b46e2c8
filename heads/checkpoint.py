"""The polyhead checkpoint directory: its layout, and reading and checking it without torch.

Layout:
    manifest.json            format version, backbone config, dtype, heads
    model.safetensors        backbone.* tensors and the shared head matrices
    tokenizers/<head>.json   one HF tokenizers file per head
    adapters/*.safetensors   adapted heads' tensors, one file per head (HeadSpec.adapter)
    tokenizers/<head>.split.npz  boundary-preserving heads only: see heads/vocab/split_table.py

A gateway in front of a remote or vLLM engine needs only the manifest and the tokenizers, so
nothing here imports torch. heads/model/weights.py loads the tensors into a MultiHeadModel
and writes checkpoints; its writes go to a temporary sibling directory that is renamed into
place, so a crash or a full disk never leaves a half-written model behind.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from pathlib import Path

from safetensors import SafetensorError, safe_open

from heads.errors import CheckpointError, TokenizerError
from heads.manifest import Manifest
from heads.vocab.split_table import SplitTable
from heads.vocab.tokenizer import HeadTokenizer, vocab_fingerprint

log = logging.getLogger(__name__)


def _tensor_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    if not path.is_file():
        raise CheckpointError(f"weights: {path} is missing")
    try:
        # numpy: reading shapes must not import torch
        with safe_open(str(path), framework="numpy") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"weights: {path} is not a readable safetensors file ({e})") from e


def load_tokenizers(directory: Path, manifest: Manifest) -> dict[str, HeadTokenizer]:
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
    manifest = check_weights(directory)
    load_tokenizers(directory, manifest)
    return manifest


def check_weights(directory: Path) -> Manifest:
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
        for served, adapter in h.adapters():
            sidecar = _tensor_shapes(directory / adapter.file)
            for name, need in adapter.shapes(h.vocab_size, d).items():
                if sidecar.get(name) != need:
                    raise CheckpointError(f"heads[{i}] ({served}) adapter: tensor {name!r} "
                                          f"has shape {sidecar.get(name)}, need {need}")
    return manifest


def load_metadata(directory: Path) -> tuple[Manifest, dict[str, HeadTokenizer]]:
    """The manifest and tokenizers without the weights: all a gateway in front of a remote
    or vLLM engine needs (the shapes are still checked against the weights file)."""
    manifest = check_weights(directory)
    return manifest, load_tokenizers(directory, manifest)


def describe_checkpoint(directory: Path) -> str:
    """A human-readable summary for `polyhead heads inspect`."""
    m = validate_checkpoint(directory)
    b = m.backbone
    shapes = _tensor_shapes(directory / m.weights)
    total = sum(math.prod(s) for s in shapes.values())
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
        for served, a in h.adapters():
            lines.append(f"adapter {served}: {a.kind} r={a.rank}, {a.steps} steps on "
                         f"{a.train_positions:,} positions, held-out BPB "
                         f"{a.heldout_bpb_before} -> {a.heldout_bpb_after} ({a.file})")
    return "\n".join(lines)

"""`polyhead heads adapt`: fit a trimmed head's adapter with the backbone frozen, and store it
in the checkpoint.

Steps: cut the corpus mix into byte windows (heads/adapt/data.py), cache the frozen model's
hidden states and folded native teacher once (heads/adapt/cache.py), train the adapter
with early stopping on held-out BPB (heads/adapt/train.py), then write its sidecar file and
the manifest that names it. The shared matrix and the native head are never changed.

`<head>+groups` adapts a split head's two-level reading: the first level, over native
context, stored as the head's `reading_adapter`. Its held-out BPB counts the first level's
bits only; the second level (exact inside a group) adds the same bits with or without it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from safetensors.torch import save_file

from heads.adapt.cache import load_or_build
from heads.adapt.data import DataConfig, split_windows
from heads.adapt.train import KL_WHERE, TrainConfig, TrainResult, heldout_bits, train
from heads.checkpoint import validate_checkpoint
from heads.errors import AdaptError
from heads.manifest import (
    ADAPTER_KINDS,
    MANIFEST_FILE,
    AdapterSpec,
    HeadSpec,
    Manifest,
    default_prefix,
)
from heads.model.weights import load_checkpoint

log = logging.getLogger(__name__)

ADAPTER_DIR = "adapters"
MAX_ADAPTER_BYTES = 8 * 2**20  # what one adapted head may add to the checkpoint


@dataclass(frozen=True, slots=True)
class AdaptConfig:
    head: str
    data: DataConfig
    train: TrainConfig = TrainConfig()
    top_k: int = 32  # folded teacher probabilities kept per position
    cache_dir: Path | None = None  # None: ~/.cache/polyhead/adapt


@dataclass(frozen=True, slots=True)
class AdaptReport:
    checkpoint: Path
    spec: AdapterSpec
    result: TrainResult
    adapter_bytes: int  # size of the sidecar file
    heldout_by_source: dict[str, tuple[float, float]]  # source -> (BPB before, after)


def _check(manifest: Manifest, cfg: AdaptConfig) -> None:
    names = manifest.head_names
    readings = manifest.readings
    if cfg.head not in names and cfg.head not in readings:
        raise AdaptError(f"unknown head {cfg.head!r}; have {names + sorted(readings)}")
    if cfg.head == manifest.native.name:
        raise AdaptError(f"{cfg.head!r} is the native head: it is the teacher and stays "
                         "bit-identical; adapt one of the trimmed heads")
    if cfg.train.kind not in ADAPTER_KINDS:
        raise AdaptError(f"kind {cfg.train.kind!r} not in {ADAPTER_KINDS}")
    if cfg.train.kl_where not in KL_WHERE:
        raise AdaptError(f"kl_where {cfg.train.kl_where!r} not in {KL_WHERE}")
    if cfg.train.rank <= 0 or cfg.train.steps <= 0:
        raise AdaptError("rank and steps must be > 0")


def _fingerprint(directory: Path, manifest: Manifest, cfg: AdaptConfig) -> str:
    """What the cached tensors depend on: weights and tokenizer bytes, head, data, k."""
    h = hashlib.sha256()
    for rel in (manifest.weights, *(s.tokenizer for s in manifest.heads)):
        with (directory / rel).open("rb") as f:
            while chunk := f.read(1 << 24):
                h.update(chunk)
    h.update(json.dumps([cfg.head, asdict(cfg.data), cfg.top_k], default=str).encode())
    return h.hexdigest()[:16]


def copy_checkpoint(src: Path, out: Path) -> None:
    """`src` copied to `out` through a temporary sibling renamed into place."""
    if out.exists():
        raise AdaptError(f"{out} exists; pick a new --out or adapt in place")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.copy-{os.getpid()}")
    shutil.copytree(src, tmp)
    tmp.rename(out)


def write_adapter(directory: Path, head: str, spec: AdapterSpec,
                  tensors: dict[str, torch.Tensor], role: str = "adapter") -> int:
    """Write the sidecar (a new file name), then swap in the manifest that names it as
    `head`'s `role` (adapter, or reading_adapter for its two-level reading); the previous
    sidecar goes last. A reader sees the old or the new adapter, never a mix. Returns the
    sidecar's size in bytes."""
    manifest = Manifest.load(directory)
    old = getattr(manifest.head(head), role)
    path = directory / spec.file
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    save_file(tensors, str(tmp), metadata={"head": head, "kind": spec.kind, "role": role})
    tmp.replace(path)
    def swap(h: HeadSpec) -> HeadSpec:
        if h.name != head:
            return h
        return replace(h, reading_adapter=spec) if role == "reading_adapter" else replace(
            h, adapter=spec)

    heads = tuple(swap(h) for h in manifest.heads)
    new = replace(manifest, heads=heads)
    new.validate()
    staged = directory / f".{MANIFEST_FILE}.adapt.tmp"
    staged.write_text(new.to_json())
    staged.replace(directory / MANIFEST_FILE)
    try:
        validate_checkpoint(directory)
    except Exception:
        # Never leave a manifest naming a broken adapter behind.
        staged.write_text(manifest.to_json())
        staged.replace(directory / MANIFEST_FILE)
        raise
    if old is not None and old.file != spec.file:
        (directory / old.file).unlink(missing_ok=True)
    return path.stat().st_size


def adapt(checkpoint: Path, cfg: AdaptConfig, out: Path | None = None) -> AdaptReport:
    """Adapt `cfg.head` of `checkpoint` (in place, or in a copy at `out`)."""
    manifest = validate_checkpoint(checkpoint)
    _check(manifest, cfg)
    ckpt = load_checkpoint(checkpoint, compute_dtype="float32")
    key = _fingerprint(checkpoint, manifest, cfg)
    cache = (cfg.cache_dir or Path.home() / ".cache" / "polyhead" / "adapt") / (
        f"{manifest.model_name}-{cfg.head}-{key}")
    log.info("adapting head %s; cache %s", cfg.head, cache)
    # A reading's adapter corrects its split head's rows, over native context.
    reading = cfg.head in manifest.readings
    head = manifest.readings[cfg.head] if reading else cfg.head
    splits = {}
    for split in ("train", "heldout"):
        splits[split] = load_or_build(cache / f"{split}.safetensors", ckpt, head,
                                      split_windows(cfg.data, split), cfg.top_k,
                                      f"cache {split}", reading)
    (train_data, _), (heldout, sources) = splits["train"], splits["heldout"]
    run_key = hashlib.sha256(json.dumps(asdict(cfg.train)).encode()).hexdigest()[:12]
    w = ckpt.model.unembedding_rows(head).float()  # the shared rows, never the adapted
    result = train(w, train_data, heldout, cfg.train, cache / f"run-{run_key}.pt")

    before = heldout_bits(None, w, heldout) / heldout["bytes"].double()
    after = heldout_bits(result.params, w, heldout) / heldout["bytes"].double()
    by_source = {s: (float(b), float(a)) for s, b, a in
                 zip(sources, before.tolist(), after.tolist(), strict=True)}
    target = checkpoint
    if out is not None and out.resolve() != checkpoint.resolve():
        copy_checkpoint(checkpoint, out)
        target = out
    t = cfg.train
    spec = AdapterSpec(
        kind=t.kind, rank=t.rank, prefix=default_prefix(cfg.head),
        file=f"{ADAPTER_DIR}/{cfg.head}-{t.kind}-r{t.rank}-{run_key}.safetensors",
        steps=result.best_step, data=tuple(f"{s}.train.txt" for s in cfg.data.sources()
                                       if (cfg.data.corpus_dir / f"{s}.train.txt").is_file()),
        train_positions=int(train_data["target"].numel()),
        heldout_bpb_before=round(result.heldout_bpb_before, 4),
        heldout_bpb_after=round(result.heldout_bpb_after, 4))
    size = write_adapter(target, head, spec, result.params.stored(spec.prefix),
                         "reading_adapter" if reading else "adapter")
    if size > MAX_ADAPTER_BYTES:
        log.warning("adapter file is %.1f MB, over the %.0f MB budget", size / 2**20,
                    MAX_ADAPTER_BYTES / 2**20)
    return AdaptReport(target, spec, result, size, by_source)

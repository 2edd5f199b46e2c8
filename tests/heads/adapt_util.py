"""A small adaptation of the tiny model's 1k head, shared by the adapter tests."""

from __future__ import annotations

import shutil
from pathlib import Path

from heads.adapt.data import DataConfig
from heads.adapt.run import AdaptConfig, AdaptReport, adapt
from heads.adapt.train import TrainConfig
from heads.data.files import TINY_CORPUS, TINY_HELDOUT


def tiny_corpus(directory: Path) -> Path:
    """The tiny model's committed text as a corpus directory with one source, `tiny`."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(TINY_CORPUS, directory / "tiny.train.txt")
    shutil.copy(TINY_HELDOUT, directory / "tiny.heldout.txt")
    return directory


def adapt_tiny(src: Path, out: Path | None, work: Path, kind: str = "lowrank", steps: int = 80,
               head: str = "1k") -> AdaptReport:
    data = DataConfig(tiny_corpus(work / "corpus"), (("tiny", 1.0),), train_bytes=40_000,
                      heldout_bytes=8_000)
    cfg = AdaptConfig(head, data, TrainConfig(kind=kind, rank=8, steps=steps, batch=256,
                                              lr=1e-2, eval_every=20, patience=3),
                      cache_dir=work / "cache")
    return adapt(src, cfg, out)

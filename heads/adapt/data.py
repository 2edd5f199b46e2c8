"""The text an adaptation trains and early-stops on, cut the way `heads eval` cuts it.

Each split is a list of byte windows (heads.eval.measure.byte_windows) over whole documents;
each window is tokenized with the head's tokenizer and scored on its own behind BOS, so
the held-out BPB here is computed exactly as `heads eval --window-bytes` computes it.

Training text is drawn from the `.train.txt` files (documents sampled across each file,
seeded); held-out text from the END of the `.heldout.txt` files, so it never overlaps the
text `heads eval` reads from their start.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from heads.corpus.splits import read_documents, source_name
from heads.errors import CorpusError
from heads.eval.measure import byte_windows

# (source, share of the bytes): English prose first, the other English sources, and some
# non-English text so the adapter does not trade other scripts away for English.
DEFAULT_MIX: tuple[tuple[str, float], ...] = (
    ("wiki", 0.40), ("gcide", 0.10), ("linux-doc", 0.10), ("python-doc", 0.10),
    ("perl-doc", 0.10), ("man-de", 0.04), ("man-fr", 0.04), ("man-ja", 0.04),
    ("man-ru", 0.04), ("man-zh", 0.04),
)


@dataclass(frozen=True, slots=True)
class DataConfig:
    corpus_dir: Path
    mix: tuple[tuple[str, float], ...] = DEFAULT_MIX
    train_bytes: int = 200_000  # ~50k positions on a 4 bytes/token head
    heldout_bytes: int = 40_000
    window_bytes: int = 2048  # what `heads eval --window-bytes` defaults to
    seed: int = 0

    def sources(self) -> list[str]:
        return [s for s, _ in self.mix]


def _train_docs(path: Path, budget: int, rng: random.Random) -> list[str]:
    """Documents sampled without replacement across the whole file, up to `budget` bytes."""
    docs = read_documents(path)
    order = list(range(len(docs)))
    rng.shuffle(order)
    picked, size = [], 0
    for i in order:
        if size >= budget:
            break
        picked.append(i)
        size += len(docs[i].encode()) + 2
    return [docs[i] for i in sorted(picked)]  # file order: neighbours stay neighbours


def _tail_docs(path: Path, budget: int) -> list[str]:
    docs = read_documents(path)
    out, size = [], 0
    for doc in reversed(docs):
        if size >= budget:
            break
        out.append(doc)
        size += len(doc.encode()) + 2
    return out[::-1]


def split_windows(cfg: DataConfig, split: str) -> dict[str, list[str]]:
    """source -> byte windows of `split` ("train" or "heldout"); sources missing from the
    corpus directory are left out (CorpusError when none is there)."""
    budget = cfg.train_bytes if split == "train" else cfg.heldout_bytes
    total = sum(w for _, w in cfg.mix)
    out: dict[str, list[str]] = {}
    for source, share in cfg.mix:
        path = cfg.corpus_dir / f"{source}.{split}.txt"
        if not path.is_file():
            continue
        n = int(budget * share / total)
        docs = (_train_docs(path, n, random.Random(f"{cfg.seed}:{source}")) if split == "train"
                else _tail_docs(path, n))
        if docs:
            out[source_name(path)] = byte_windows("\n\n".join(docs), cfg.window_bytes)
    if not out:
        raise CorpusError(f"{cfg.corpus_dir}: none of {cfg.sources()} has a {split} split "
                          "(build the corpus with `polyhead corpus build`)")
    return out

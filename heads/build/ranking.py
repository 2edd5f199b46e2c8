"""Token rankings for nested heads: count a corpus, weight its sources, save the order.

Counts run over whole files, as the text is, so the tokens of whitespace and newline runs
(`\\n\\n` between paragraphs) are counted like any other. Each source's counts are turned
into frequencies and mixed with a deliberate weight per source (`SourceWeights`), so a large
source (a dictionary, kernel documentation) does not drown the prose the heads serve.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from heads.corpus.builder import all_sources
from heads.corpus.splits import source_name
from heads.corpus.text import read_text
from heads.errors import TokenizerError
from heads.vocab.tokenizer import vocab_fingerprint
from heads.vocab.trimming import count_tokens, rank_tokens

log = logging.getLogger(__name__)

# Expected shares of English traffic by kind of text: chat is mostly prose, then code and
# technical writing, with definitions and word questions a small part. Sources missing from
# this table get the mean share.
ENGLISH_TRAFFIC = {"wiki": 0.45, "python-doc": 0.20, "linux-doc": 0.15, "perl-doc": 0.10,
                   "gcide": 0.10}
# With `english-first`, this share of the weight is spread over the other languages (each
# language equally), so every script keeps its common characters and syllables.
OTHER_LANGUAGES_SHARE = 0.10
PRESETS = ("english-first", "balanced", "equal")
# Files are counted in pieces of about this many characters (the Rust side encodes pieces
# in parallel); a cut goes where a line starts with a non-space, so whitespace runs stay whole.
_PIECE_CHARS = 1 << 20


@dataclass(frozen=True, slots=True)
class Ranking:
    order: list[int]  # old ids in Matryoshka order
    vocab_sha256: str  # of the tokenizer the order was ranked for
    source: str  # what it was ranked on, with each source's weight


@dataclass(frozen=True, slots=True)
class SourceWeights:
    """How much each corpus source counts: a preset name, or explicit `name=weight` pairs.

    - `english-first`: English sources by `ENGLISH_TRAFFIC`, and `OTHER_LANGUAGES_SHARE` of
      the total spread evenly over the other languages present;
    - `balanced`: every language present gets the same share (English split as above);
    - `equal`: every source the same;
    - `wiki=3,gcide=1`: relative weights; a file without one is an error.
    """

    preset: str | None = "english-first"
    explicit: tuple[tuple[str, float], ...] = ()

    @classmethod
    def parse(cls, spec: str) -> SourceWeights:
        if spec in PRESETS:
            return cls(spec)
        pairs = []
        for item in spec.split(","):
            name, sep, value = item.partition("=")
            try:
                w = float(value)
            except ValueError:
                w = -1.0
            if not sep or not name.strip() or w < 0:
                raise ValueError(f"source weights: {item!r} is not NAME=WEIGHT (>= 0); "
                                 f"or use a preset: {', '.join(PRESETS)}")
            pairs.append((name.strip(), w))
        return cls(None, tuple(pairs))

    def of(self, files: list[Path]) -> dict[Path, float]:
        """Weight per file, summing to 1 (files of weight 0 are left out)."""
        names = {p: source_name(p) for p in files}
        if self.preset is None:
            given = dict(self.explicit)
            missing = sorted({n for n in names.values() if n not in given})
            if missing:
                raise ValueError(f"source weights: no weight for {', '.join(missing)}")
            raw = {p: given[n] for p, n in names.items()}
        elif self.preset == "equal":
            raw = dict.fromkeys(files, 1.0)
        else:
            raw = self._by_language(names)
        total = sum(raw.values())
        if total <= 0:
            raise ValueError("source weights: all weights are 0")
        return {p: w / total for p, w in raw.items() if w > 0}

    def _by_language(self, names: dict[Path, str]) -> dict[Path, float]:
        langs = {p: language_of(p) for p in names}
        present = sorted(set(langs.values()))
        others = [lang for lang in present if lang != "en"]
        if self.preset == "balanced" or "en" not in present:
            share = dict.fromkeys(present, 1 / len(present))
        else:
            share = {"en": 1 - OTHER_LANGUAGES_SHARE if others else 1.0,
                     **dict.fromkeys(others, OTHER_LANGUAGES_SHARE / max(len(others), 1))}
        mean = sum(ENGLISH_TRAFFIC.values()) / len(ENGLISH_TRAFFIC)
        out: dict[Path, float] = {}
        for lang in present:
            members = [p for p in names if langs[p] == lang]
            within = {p: ENGLISH_TRAFFIC.get(names[p], mean) if lang == "en" else 1.0
                      for p in members}
            norm = sum(within.values())
            out.update({p: share[lang] * w / norm for p, w in within.items()})
        return out


def language_of(path: Path) -> str:
    """A corpus file's language: from the corpus.json beside it, else the pinned source of
    that name, else English."""
    name = source_name(path)
    index = path.parent / "corpus.json"
    if index.is_file():
        for s in json.loads(index.read_text()).get("sources", []):
            if s.get("name") == name:
                return str(s.get("language", "en"))
    return next((s.language for s in all_sources() if s.name == name), "en")


def file_pieces(text: str, size: int = _PIECE_CHARS) -> list[str]:
    """`text` in consecutive pieces of about `size` characters, each cut at a line start
    that is not whitespace; the pieces concatenate back to `text`."""
    out, start = [], 0
    while start < len(text):
        end = start + size
        while end < len(text) and not (text[end - 1] == "\n" and not text[end].isspace()):
            end += 1
        out.append(text[start:end])
        start = end
    return out


def rank_on_corpus(tok: Tokenizer, files: list[Path], keep_first: set[str] | None,
                   weights: SourceWeights | None = None) -> Ranking:
    """Rank the tokens of `tok` by their weighted frequency over `files`."""
    share = (weights or SourceWeights()).of(files)
    score: dict[int, float] = {}
    for path, w in share.items():
        counts = count_tokens(tok, file_pieces(read_text(path)))
        total = sum(counts.values()) or 1
        for i, c in counts.items():
            score[i] = score.get(i, 0.0) + w * c / total
        log.info("counted %s (weight %.3f): %d tokens, %d distinct", path.name, w, total,
                 len(counts))
    order = rank_tokens(tok, score, keep_first=keep_first)
    source = ", ".join(f"{p.name}={w:.3f}" for p, w in share.items())
    return Ranking(order, vocab_fingerprint(tok), source)


def save_ranking(path: Path, ranking: Ranking) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:  # np.savez_compressed would append .npz to a str path
        np.savez_compressed(f, order=np.asarray(ranking.order, dtype=np.int32),
                            vocab_sha256=np.asarray(ranking.vocab_sha256),
                            source=np.asarray(ranking.source))


def load_ranking(path: Path) -> Ranking:
    try:
        with np.load(path, allow_pickle=False) as z:
            return Ranking(z["order"].astype(np.int64).tolist(), str(z["vocab_sha256"]),
                           str(z["source"]))
    except (OSError, KeyError, ValueError) as e:
        raise TokenizerError(f"{path}: not a token ranking file ({e})") from e

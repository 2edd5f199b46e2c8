"""Boundary-preserving heads: spell every native token in the ids of a smaller head.

A head trimmed by filtering BPE merges re-segments text around each removed token: with
merges (a, b) then (b, c) and "ab" removed, "ab|c" becomes "a|bc", so the backbone sees
boundaries it never saw in training. A split table instead keeps the native tokenizer's
segmentation and re-spells only the removed tokens: native id t becomes
`pieces[offsets[t]:offsets[t + 1]]`, a fixed split of its text into kept ids. Every native
boundary stays where it was, and decoding is unchanged (the pieces concatenate to the
token's text). The split is how the head's merge-filtered BPE spells the token's text on
its own ("bpe", the default: those are the pieces the backbone sees for such words in the
merge-filtered head), or the fewest kept pieces ("fewest", ties to the most frequent, i.e.
lowest, ids); characters no kept token spells go to byte tokens.

On disk, `tokenizers/<head>.split.npz`: `offsets` [V_native + 1] int64, `pieces` int32 (each
< V_head), and `encoder_sha256`, the vocabulary fingerprint of the native tokenizer the
table was built for.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from heads.errors import TokenizerError
from heads.vocab.specials import spelled_specials
from heads.vocab.trimming import _byte_symbols, _has_type

SHORT_IDS = 64  # below this many token ids a Python loop beats numpy's fixed per-call cost

log = logging.getLogger(__name__)

_INF = 1 << 60
SPELLINGS = ("bpe", "fewest")


@dataclass(frozen=True, slots=True)
class SplitTable:
    offsets: np.ndarray  # [V_native + 1] int64
    pieces: np.ndarray  # [offsets[-1]] int32, every value < vocab_size
    vocab_size: int  # V of the head the pieces belong to
    encoder_sha256: str  # vocabulary fingerprint of the native tokenizer
    # [V_native] int64: how many of this head's ids spell each native id (offsets' diff).
    lengths: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "lengths", np.diff(self.offsets))

    @property
    def native_size(self) -> int:
        return len(self.offsets) - 1

    def expand(self, ids: Sequence[int]) -> list[int]:
        """Native ids -> this head's ids, vectorised: kept ids map to themselves."""
        if len(ids) < SHORT_IDS and (not ids or max(ids) < self.vocab_size):
            return list(ids)  # the common short prompt with nothing to split, without numpy
        a = np.asarray(ids, dtype=np.int64)
        if not a.size or int(a.max()) < self.vocab_size:
            return list(ids)
        start = self.offsets[a]
        n = self.offsets[a + 1] - start
        # Index of each output piece: its token's start plus its rank within the token.
        first = np.cumsum(n) - n
        idx = np.repeat(start - first, n) + np.arange(int(n.sum()))
        return self.pieces[idx].tolist()

    def first_piece(self, native_id: int) -> int:
        """The first of this head's ids spelling `native_id`."""
        return int(self.pieces[self.offsets[native_id]])

    def sources(self, ids: Sequence[int]) -> np.ndarray:
        """For each id `expand(ids)` returns, the index in `ids` of the native id it spells."""
        a = np.asarray(ids, dtype=np.int64)
        if not a.size:
            return np.zeros(0, dtype=np.int64)
        return np.repeat(np.arange(a.size), self.offsets[a + 1] - self.offsets[a])

    def to_bytes(self) -> bytes:
        buf = io.BytesIO()
        np.savez_compressed(buf, offsets=self.offsets, pieces=self.pieces,
                            vocab_size=np.asarray(self.vocab_size),
                            encoder_sha256=np.asarray(self.encoder_sha256))
        return buf.getvalue()

    @classmethod
    def load(cls, path: Path) -> SplitTable:
        try:
            with np.load(path, allow_pickle=False) as z:
                table = cls(z["offsets"].astype(np.int64), z["pieces"].astype(np.int32),
                            int(z["vocab_size"]), str(z["encoder_sha256"]))
        except (OSError, KeyError, ValueError) as e:
            raise TokenizerError(f"{path}: not a split table ({e})") from e
        ok = (table.offsets[0] == 0 and np.all(np.diff(table.offsets) >= 1)
              and table.offsets[-1] == len(table.pieces)
              and (not len(table.pieces) or int(table.pieces.max()) < table.vocab_size))
        if not ok:
            raise TokenizerError(f"{path}: offsets or pieces out of range")
        return table


def build_split_table(native: Tokenizer, vocab_size: int, encoder_sha256: str,
                      spelling: str = "bpe", trimmed: Tokenizer | None = None) -> SplitTable:
    """The table for the head of ids [0, vocab_size) of `native` (in Matryoshka order, so
    the head's ids are a prefix of the native ones).

    `spelling` is how a removed token is re-spelled: "bpe", as the head's own
    merge-filtered BPE (`trimmed`) spells the token's text on its own, falling back to the
    fewest pieces where that is not exact; or "fewest", the fewest kept pieces.
    """
    if spelling not in SPELLINGS:
        raise ValueError(f"spelling must be one of {SPELLINGS}, not {spelling!r}")
    if spelling == "bpe" and trimmed is None:
        raise ValueError("spelling 'bpe' needs the head's trimmed tokenizer")
    d = json.loads(native.to_str())
    model = d["model"]
    if model.get("type") != "BPE":
        raise TokenizerError(f"split tables need a BPE tokenizer, not {model.get('type')}")
    text_of = {i: t for t, i in model["vocab"].items()}
    for a in d["added_tokens"]:  # content is raw text: spell it as the vocab strings do
        text_of.setdefault(a["id"], _as_vocab_string(d, a["content"]))
    n = len(text_of)
    if set(text_of) != set(range(n)) or not 0 < vocab_size <= n:
        raise TokenizerError(f"need contiguous ids and 0 < vocab_size <= {n}")
    kept = {text_of[i]: i for i in range(vocab_size)}
    byte_ids = None
    if model.get("byte_fallback"):
        byte_ids = [kept.get(f"<0x{b:02X}>") for b in range(256)]
        if None in byte_ids:
            raise TokenizerError("the head lacks byte-fallback tokens; it cannot spell text")
    longest = max(len(t) for t in kept)
    offsets = np.zeros(n + 1, dtype=np.int64)
    pieces: list[int] = list(range(vocab_size))
    offsets[1:vocab_size + 1] = np.arange(1, vocab_size + 1)
    by_bpe = _bpe_spellings(native, trimmed, vocab_size, n) if trimmed is not None else {}
    for i in range(vocab_size, n):
        pieces += by_bpe.get(i) or _spell(text_of[i], kept, longest, byte_ids)
        offsets[i + 1] = len(pieces)
    log.debug("split table for V=%d: %d native ids re-spelled in %d pieces", vocab_size,
              n - vocab_size, len(pieces) - vocab_size)
    return SplitTable(offsets, np.asarray(pieces, dtype=np.int32), vocab_size, encoder_sha256)


def _bpe_spellings(native: Tokenizer, trimmed: Tokenizer, vocab_size: int, n: int
                   ) -> dict[int, list[int]]:
    """Native id -> the trimmed BPE's ids for that token's text alone, where they decode
    back to exactly that text (a token holding part of a UTF-8 character does not)."""
    spelled = spelled_specials(trimmed)  # a special's text is spelled, never matched
    ids = range(vocab_size, n)
    texts = [native.decode([i], skip_special_tokens=False) for i in ids]
    out = {}
    for i, text, enc in zip(ids, texts, spelled.encode_batch_fast(texts, add_special_tokens=False),
                            strict=True):
        if enc.ids and native.decode(enc.ids, skip_special_tokens=False) == text:
            out[i] = enc.ids
    return out


def _as_vocab_string(d: dict, text: str) -> str:
    if d["model"].get("byte_fallback"):
        return text.replace(" ", "▁")
    if _has_type(d.get("pre_tokenizer"), "ByteLevel"):
        symbols = _byte_symbols()
        return "".join(symbols[b] for b in text.encode())
    return text


def _spell(text: str, kept: dict[str, int], longest: int,
           byte_ids: list[int | None] | None) -> list[int]:
    """Fewest kept tokens that concatenate to `text`, ties to the lowest sum of ids; a
    character no kept token covers is spelled in its UTF-8 byte tokens."""
    n = len(text)
    best = [(0, 0)] + [(_INF, _INF)] * n  # (pieces, sum of ids) of the best spelling of text[:j]
    back: list[tuple[int, tuple[int, ...]]] = [(0, ())] * (n + 1)
    for j in range(1, n + 1):
        for i in range(max(0, j - longest), j):
            if best[i][0] == _INF:
                continue
            tid = kept.get(text[i:j])
            if tid is not None:
                spelled: tuple[int, ...] = (tid,)
            elif j == i + 1 and byte_ids is not None:
                spelled = tuple(byte_ids[b] for b in text[i].encode())  # type: ignore[misc]
            else:
                continue
            cand = (best[i][0] + len(spelled), best[i][1] + sum(spelled))
            if cand < best[j]:
                best[j], back[j] = cand, (i, spelled)
    if best[n][0] == _INF:
        raise TokenizerError(f"token {text!r} cannot be spelled in the head's tokens")
    out: list[tuple[int, ...]] = []
    j = n
    while j:
        i, spelled = back[j]
        out.append(spelled)
        j = i
    return [t for part in reversed(out) for t in part]

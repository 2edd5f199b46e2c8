"""Per-head measurement on held-out text: `polyhead heads eval`.

For each head and source file: bytes/token, bits per byte (BPB) with that head's tokenizer
and its logits restricted to its V, prefill tokens/s, the fraction of tokens not in the
native head's segmentation, and the share of byte-fallback tokens. BPB runs through the
backbone directly (no engine): the sum of -log2 p(token) over every text token, divided by
the text's UTF-8 bytes.

Windows: with `window_bytes` the text is cut into fixed byte windows (at whitespace near the
end, else at a character boundary), and each window is tokenized and scored on its own,
prefixed with BOS, on every head. So every head sees the same bytes of context and its
context resets land at the same bytes. Without it, windows are `window` tokens of each
head's own tokenization (resets land at different bytes per head).
"""

from __future__ import annotations

import logging
import math
import time
import unicodedata
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from heads.corpus.splits import read_documents, source_name
from heads.eval.grouped import first_level, grouped_token_bits
from heads.manifest import READING_SUFFIX
from heads.model.forward import forward_hidden
from heads.model.weights import Checkpoint
from heads.vocab.piece_groups import PieceGroups
from heads.vocab.specials import spelled_specials
from heads.vocab.split_table import SplitTable

log = logging.getLogger(__name__)

AGGREGATE = "all"
KINDS = ("native", "separator", "byte_fallback", "split_word")  # see kind_of


@dataclass(frozen=True, slots=True)
class HeadSourceResult:
    head: str
    vocab_size: int
    source: str
    bytes: int  # UTF-8 bytes of the evaluated text
    tokens: int
    bits: float  # sum of -log2 p over the tokens
    prefill_seconds: float
    differing_tokens: int  # tokens not also a token of the native head (span and byte-ness)
    byte_fallback_tokens: int = 0  # <0xXX> tokens (characters the head cannot spell)
    bits_by_kind: dict[str, float] = field(default_factory=dict)  # KINDS -> bits
    # A two-level reading's: native rows its second level read over the tokens (the group
    # of each token's piece, where it has more than one member).
    group_rows: int = 0

    @property
    def bytes_per_token(self) -> float:
        return self.bytes / self.tokens

    @property
    def bpb(self) -> float:
        return self.bits / self.bytes

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.tokens / self.prefill_seconds if self.prefill_seconds else math.nan

    @property
    def differing_fraction(self) -> float:
        return self.differing_tokens / self.tokens

    @property
    def byte_fallback_share(self) -> float:
        return self.byte_fallback_tokens / self.tokens

    def row(self) -> dict:
        return {**asdict(self), "bytes_per_token": self.bytes_per_token, "bpb": self.bpb,
                "prefill_tokens_per_s": self.prefill_tokens_per_s,
                "differing_fraction": self.differing_fraction,
                "byte_fallback_share": self.byte_fallback_share}


@torch.inference_mode()
def token_bits(ckpt: Checkpoint, head: str, ids: list[int], window: int,
               w32: torch.Tensor | None = None, round_to: torch.dtype | None = None
               ) -> tuple[torch.Tensor, float]:
    """(-log2 p(token | context) per id [len(ids)] fp64, seconds in the backbone), in windows
    of `window` tokens; the second is the prefill time (logits excluded).

    With a BOS id every window starts with BOS and all ids are scored; without one, windows
    overlap by one token and the first id (which has no context) is not scored (0 bits).
    `w32` is the head's unembedding in fp32 [V, d]: logits in the checkpoint dtype (bf16)
    would round by ~0.1 nats at logit magnitudes around 30. `round_to` (bf16) rounds each
    logit once to that dtype after the fp32 product, as the CPU engine's packed bf16 rows
    serve them (kernels.packed_rows), so the BPB is the served one.
    """
    bos = ckpt.manifest.head(head).bos_token_id
    out = ckpt.model.head_output(head)
    # An adapted head's rows (folded low-rank) are its own, not the shared fp32 copy.
    w = out.weight.float() if w32 is None or out.adapted else w32
    if bos is not None:
        contexts = [[bos, *ids[i:i + window - 1]] for i in range(0, len(ids), window - 1)]
    else:
        contexts = [ids[i:i + window] for i in range(0, max(len(ids) - 1, 0), window - 1)]
    nats = [torch.zeros(0 if bos is not None else min(len(ids), 1), dtype=torch.float64)]
    seconds = 0.0
    for ctx in contexts:
        t0 = time.perf_counter()
        hidden = forward_hidden(ckpt, head, ctx)[:-1].float()  # predicts ctx[1:]
        seconds += time.perf_counter() - t0
        target = torch.tensor(ctx[1:], device=hidden.device)
        for r in range(0, hidden.shape[0], 128):  # [128, V] fp32 logits at a time
            logits = out.logits(hidden[r:r + 128], w)
            if round_to is not None:
                logits = logits.to(round_to).float()
            nats.append(F.cross_entropy(logits, target[r:r + 128], reduction="none")
                        .double().cpu())
    return torch.cat(nats) / math.log(2), seconds


def sequence_bits(ckpt: Checkpoint, head: str, ids: list[int], window: int,
                  w32: torch.Tensor | None = None) -> tuple[float, float]:
    """(sum of -log2 p(token | context) over the ids, seconds in the backbone); windows as
    in `token_bits`."""
    bits, seconds = token_bits(ckpt, head, ids, window, w32)
    return float(bits.sum()), seconds


def _native_tokens(text: str, tok: Tokenizer, byte_ids: frozenset[int]
                   ) -> set[tuple[int, int, bool]]:
    """(start, end, is byte token) of the native head's tokens. Offsets are in characters,
    so the byte tokens of one character all carry that character's span: the flag keeps a
    trimmed head's byte fallback from matching a native one-character token."""
    ids, offsets = _spans(text, tok)
    return {(a, b, i in byte_ids) for i, (a, b) in zip(ids, offsets, strict=True)}


def _spans(text: str, tok: Tokenizer) -> tuple[list[int], list[tuple[int, int]]]:
    enc = tok.encode(text, add_special_tokens=False)
    return enc.ids, enc.offsets


def byte_windows(text: str, window_bytes: int) -> list[str]:
    """`text` cut into consecutive pieces of at most `window_bytes` UTF-8 bytes (a single
    character longer than that is its own piece). A cut goes after the last whitespace in
    the final eighth of the window when there is one, else at a character boundary; the
    pieces concatenate back to `text`."""
    if window_bytes < 8:
        raise ValueError(f"window_bytes must be at least 8, got {window_bytes}")
    data = text.encode()
    out, start = [], 0
    while start < len(data):
        end = min(start + window_bytes, len(data))
        while end < len(data) and end > start and (data[end] & 0xC0) == 0x80:
            end -= 1  # back off a UTF-8 continuation byte
        if end == start:  # one character wider than the window
            end += 1
            while end < len(data) and (data[end] & 0xC0) == 0x80:
                end += 1
        elif end < len(data):
            cut = max(data.rfind(c, start + window_bytes * 7 // 8, end) for c in b" \n\t")
            if cut > start:
                end = cut + 1
        out.append(data[start:end].decode())
        start = end
    return out


def _byte_token_ids(tok: Tokenizer) -> frozenset[int]:
    return frozenset(i for t, i in tok.get_vocab().items()
                     if len(t) == 6 and t.startswith("<0x") and t.endswith(">"))


GROUPED = READING_SUFFIX  # a nested head's row scored as a two-level softmax


def evaluate(ckpt: Checkpoint, files: list[Path], max_bytes: int, window: int,
             window_bytes: int | None = None, only: list[str] | None = None,
             grouped: bool = False, round_logits: bool = False) -> list[HeadSourceResult]:
    """Every head (or the heads named in `only`) over each file. `grouped`: also each
    boundary-preserving head read as the first level of a two-level softmax over the native
    vocabulary (heads.eval.grouped), as a row named head + GROUPED. `round_logits`: logits
    rounded to the compute dtype, as served (token_bits; the grouped rows stay fp32)."""
    round_to = ckpt.model.dtype if round_logits else None
    heads = sorted(ckpt.manifest.heads, key=lambda h: h.vocab_size)
    native = heads[-1].name
    unknown = sorted(set(only or ()) - {h.name for h in heads})
    if unknown:
        raise KeyError(f"no head {unknown[0]!r}; heads: {', '.join(h.name for h in heads)}")
    # Corpus text is untrusted text, as at serving time: special-token text is spelled.
    plain = {native: spelled_specials(ckpt.tokenizers[native].tokenizer)}
    for h in heads[:-1]:  # a boundary-preserving head encodes with the native tokenizer
        tok = ckpt.tokenizers[h.name]
        plain[h.name] = plain[native] if tok.split else spelled_specials(tok.tokenizer)
    byte_ids = {h.name: _byte_token_ids(ckpt.tokenizers[h.name].tokenizer) for h in heads}
    full = ckpt.model.unembedding_rows(native).float()  # nested heads read a prefix of it
    w32 = {h.name: (full[:h.vocab_size] if ckpt.manifest.head(h.name).unembedding
                    == ckpt.manifest.head(native).unembedding
                    else ckpt.model.unembedding_rows(h.name).float()) for h in heads}
    # The two-level reading scores each byte window as one context, like the other rows.
    if grouped and not window_bytes:
        raise ValueError("the grouped reading scores byte windows: give window_bytes")
    groups = {h.name: PieceGroups.from_split(split) for h in heads[:-1] if grouped
              and (split := ckpt.tokenizers[h.name].split) is not None
              and h.unembedding == ckpt.manifest.head(native).unembedding}
    results = []
    for path in files:
        text = _head_of(path, max_bytes)
        pieces = byte_windows(text, window_bytes) if window_bytes else [text]
        native_spans = [_native_tokens(p, plain[native], byte_ids[native]) for p in pieces]
        native_ids = [_spans(p, plain[native])[0] for p in pieces] if groups else []
        for h in heads:
            if only is not None and h.name not in only:
                continue
            r = _score(ckpt, h.name, h.vocab_size, source_name(path), pieces, native_spans,
                       _Segmenter(plain[h.name], ckpt.tokenizers[h.name].split,
                                  ckpt.tokenizers[h.name].tokenizer),
                       byte_ids[h.name], window if not window_bytes else None, w32[h.name],
                       round_to)
            log.info("%s %s: %.3f bytes/token, %.4f BPB, %.0f tok/s", h.name, r.source,
                     r.bytes_per_token, r.bpb, r.prefill_tokens_per_s)
            results.append(r)
            if h.name in groups:
                r = _score_grouped(ckpt, h.name, native, source_name(path), pieces,
                                   native_ids, groups[h.name], full)
                log.info("%s %s: %.4f BPB", r.head, r.source, r.bpb)
                results.append(r)
    return results


def _score_grouped(ckpt: Checkpoint, head: str, native: str, source: str, pieces: list[str],
                   native_ids: list[list[int]], groups: PieceGroups, rows: torch.Tensor
                   ) -> HeadSourceResult:
    """One nested head read as a two-level softmax over one source's pieces."""
    bits, dt, n, read = 0.0, 0.0, 0, 0
    level1 = first_level(ckpt, head)
    for ids in native_ids:
        b, t = grouped_token_bits(ckpt, native, ids, groups, level1, rows)
        bits, dt, n = bits + float(b.sum()), dt + t, n + len(ids)
        sizes = groups.sizes[groups.piece[np.asarray(ids, dtype=np.int64)]]
        read += int(sizes[sizes > 1].sum())
    return HeadSourceResult(head + GROUPED, ckpt.manifest.head(head).vocab_size, source,
                            sum(len(p.encode()) for p in pieces), n, bits, dt, 0,
                            group_rows=read)


def kind_of(token_text: str, is_native: bool, is_byte: bool) -> str:
    """What a token of a trimmed head is, for splitting its bits: the native head's own
    token, a byte-fallback token, a separator (no letter or digit), or a piece of a word."""
    if is_native:
        return "native"
    if is_byte:
        return "byte_fallback"
    # Combining marks (Devanagari vowel signs, viramas) belong to words, too.
    word = any(c.isalnum() or unicodedata.category(c).startswith("M") for c in token_text)
    return "split_word" if word else "separator"


@dataclass(frozen=True, slots=True)
class _Segmenter:
    """One head's tokens of a text with their character spans, and for each whether it is
    a whole native token (None: unknown, found by matching spans)."""

    plain: Tokenizer  # the tokenizer the head encodes with, special text as plain text
    split: SplitTable | None  # for a boundary-preserving head
    head: Tokenizer  # the head's own tokenizer, for token strings

    def __call__(self, text: str) -> tuple[list[int], list[tuple[int, int]], list[str],
                                           list[bool] | None]:
        ids, offsets = _spans(text, self.plain)
        if self.split is None:
            return ids, offsets, [text[a:b] for a, b in offsets], None
        src = self.split.sources(ids).tolist()
        out = self.split.expand(ids)
        whole = [ids[j] < self.split.vocab_size for j in src]
        # A re-spelled piece's span is its native token's; its own string says what it is.
        texts = [text[slice(*offsets[j])] if w else (self.head.id_to_token(i) or "")
                 for i, j, w in zip(out, src, whole, strict=True)]
        return out, [offsets[j] for j in src], texts, whole


def _score(ckpt: Checkpoint, head: str, vocab_size: int, source: str, pieces: list[str],
           native_spans: list[set[tuple[int, int, bool]]], segment: _Segmenter,
           byte_ids: frozenset[int], window: int | None, w32: torch.Tensor,
           round_to: torch.dtype | None = None) -> HeadSourceResult:
    """One head over one source's pieces; `window` None scores each piece as one context."""
    n_tokens = differ = fallback = 0
    dt = 0.0
    kinds = dict.fromkeys(KINDS, 0.0)
    for piece, spans in zip(pieces, native_spans, strict=True):
        ids, offsets, texts, whole = segment(piece)
        bits, t = token_bits(ckpt, head, ids, window or len(ids) + 1, w32, round_to)
        dt += t
        n_tokens += len(ids)
        for n, (i, (a, b), bit) in enumerate(zip(ids, offsets, bits.tolist(), strict=True)):
            is_byte = i in byte_ids
            native = (a, b, is_byte) in spans if whole is None else whole[n]
            k = kind_of(texts[n], native, is_byte)
            kinds[k] += bit
            differ += k != "native"
            fallback += is_byte  # counted even where the native head falls back too
    return HeadSourceResult(head, vocab_size, source, sum(len(p.encode()) for p in pieces),
                            n_tokens, sum(kinds.values()), dt, differ, fallback, kinds)


def _head_of(path: Path, max_bytes: int) -> str:
    """Whole documents from the start of the file, up to max_bytes of UTF-8."""
    out: list[str] = []
    size = 0
    for doc in read_documents(path):
        n = len(doc.encode()) + 2
        if out and size + n > max_bytes:
            break
        out.append(doc)
        size += n
    return "\n\n".join(out)


def aggregate(results: list[HeadSourceResult]) -> list[HeadSourceResult]:
    """Per head, the sum over sources (BPB and bytes/token of the held-out aggregate)."""
    out = []
    for head in dict.fromkeys(r.head for r in results):
        rs = [r for r in results if r.head == head]
        out.append(HeadSourceResult(
            head, rs[0].vocab_size, AGGREGATE, sum(r.bytes for r in rs),
            sum(r.tokens for r in rs), sum(r.bits for r in rs),
            sum(r.prefill_seconds for r in rs), sum(r.differing_tokens for r in rs),
            sum(r.byte_fallback_tokens for r in rs),
            {k: sum(r.bits_by_kind.get(k, 0.0) for r in rs) for k in KINDS}))
    return out


def by_source(results: list[HeadSourceResult]) -> dict[str, dict[str, dict[str, Any]]]:
    """source -> head -> {bytes_per_token, bpb, byte_fallback_share, bpb_vs_native}."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for source in dict.fromkeys(r.source for r in results):
        rs = sorted((r for r in results if r.source == source), key=lambda r: r.vocab_size)
        # Without the native head (`evaluate(only=...)`), relative to the largest scored.
        native = rs[-1].bpb
        out[source] = {r.head: {"vocab_size": r.vocab_size, "bytes": r.bytes,
                                "tokens": r.tokens,
                                "bytes_per_token": round(r.bytes_per_token, 4),
                                "bpb": round(r.bpb, 4),
                                "byte_fallback_share": round(r.byte_fallback_share, 5),
                                "bpb_by_kind": {k: round(v / r.bytes, 4)
                                                for k, v in r.bits_by_kind.items()},
                                "bpb_vs_native": round(r.bpb / native, 4),
                                **({"group_rows_per_token": round(r.group_rows / r.tokens, 1)}
                                   if r.group_rows else {})} for r in rs}
    return out

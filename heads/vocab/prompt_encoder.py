"""Tokenize a request's prompts with every head at once, before the router decides.

The router needs every head's counts (tokens, byte-fallback bytes); the engine needs the
chosen head's ids only. Heads that encode on their own run in parallel threads (the Rust
tokenizer releases the GIL for a batch encode). A boundary-preserving head shares the native
encoding, and its counts are read from its split table per native id; its ids are spelled
on first use, so only the chosen head's (or a spill target's) ever are.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from heads.vocab.scripts import script_class
from heads.vocab.tokenizer import HeadTokenizer

log = logging.getLogger(__name__)


class HeadPrompt:
    """One head's tokenization of a request's prompts: `ids` per prompt text (BOS included
    where the head has one), `lengths` their token counts, `fallback_bytes` the prompt bytes
    spelled with byte-fallback tokens over all prompts. Given `spell` instead of ids, the ids
    are computed on first access (then kept)."""

    __slots__ = ("_ids", "_spell", "lengths", "fallback_bytes")

    def __init__(self, ids: tuple[tuple[int, ...], ...] | None, fallback_bytes: int, *,
                 lengths: tuple[int, ...] | None = None,
                 spell: Callable[[], tuple[tuple[int, ...], ...]] | None = None) -> None:
        if ids is None and (spell is None or lengths is None):
            raise ValueError("a deferred HeadPrompt needs its lengths and a spell function")
        self._ids = ids
        self._spell = spell
        self.lengths = lengths if lengths is not None else tuple(len(p) for p in ids or ())
        self.fallback_bytes = fallback_bytes

    @property
    def ids(self) -> tuple[tuple[int, ...], ...]:
        if self._ids is None:
            assert self._spell is not None
            self._ids, self._spell = self._spell(), None
        return self._ids

    @property
    def tokens(self) -> int:
        return sum(self.lengths)


@dataclass(frozen=True, slots=True)
class EncodedPrompt:
    texts: tuple[str, ...]
    prompt_bytes: int  # UTF-8 bytes, all prompts
    script: str  # heads.vocab.scripts class of the prompts
    heads: Mapping[str, HeadPrompt]  # head -> its tokenization


class PromptEncoder:
    """Owns a small thread pool; close() it with the app."""

    def __init__(self, tokenizers: Mapping[str, HeadTokenizer],
                 bos_ids: Mapping[str, int | None]) -> None:
        self.tokenizers = dict(tokenizers)
        self.bos_ids = dict(bos_ids)
        self._pool = ThreadPoolExecutor(max(1, len(self.tokenizers) - 1),
                                        thread_name_prefix="encode")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def encode(self, texts: Sequence[str], chat: bool,
               heads: Sequence[str] | None = None) -> EncodedPrompt:
        """Tokenize `texts` with `heads` (default: every head), in parallel.

        Chat prompts are rendered by the model's template, so special tokens in them are
        real; in a raw completion prompt they are plain text (no prompt injection).
        """
        names = list(self.tokenizers) if heads is None else list(heads)
        texts = tuple(texts)
        # Boundary-preserving heads re-spell the native encoding: one encode serves them all.
        roots = list({id(r): r for r in (self._root(h) for h in names)}.values())
        # The calling thread encodes the first tokenizer while the pool takes the rest.
        futures = [self._pool.submit(r.encode_batch, texts, chat) for r in roots[1:]]
        encoded = {id(roots[0]): roots[0].encode_batch(texts, chat)} if roots else {}
        encoded.update({id(r): f.result() for r, f in zip(roots[1:], futures, strict=True)})
        natives: dict[int, list[np.ndarray]] = {}  # root -> its ids as arrays, once
        out = {}
        for h in names:
            root = id(self._root(h))
            if self.tokenizers[h].split is None:
                out[h] = self._prompt(h, encoded[root])
            else:
                if root not in natives:
                    natives[root] = [np.asarray(ids, dtype=np.int64) for ids in encoded[root]]
                out[h] = self._counted(h, encoded[root], natives[root])
        return EncodedPrompt(texts, sum(len(t.encode()) for t in texts),
                             script_class("".join(texts)), out)

    def _root(self, head: str) -> HeadTokenizer:
        tok = self.tokenizers[head]
        return tok.encoder if tok.split is not None and tok.encoder is not None else tok

    def _counted(self, head: str, encoded: list[list[int]],
                 natives: list[np.ndarray]) -> HeadPrompt:
        """A split head's prompt from the native ids: counts now, ids when first asked for.
        Equal to `_prompt` on the expanded ids (BOS is below every head's V, so it is kept)."""
        tok, bos = self.tokenizers[head], self.bos_ids.get(head)
        assert tok.split is not None
        lengths, fallback = [], 0
        for ids, native in zip(encoded, natives, strict=True):
            n, fb = tok.count_native(native)
            fallback += fb
            first = tok.split.first_piece(ids[0]) if ids else None
            lengths.append(n + (bos is not None and first != bos))
        return HeadPrompt(None, fallback, lengths=tuple(lengths),
                          spell=lambda: self._prompt(head, encoded).ids)

    def _prompt(self, head: str, encoded: list[list[int]]) -> HeadPrompt:
        tok, bos = self.tokenizers[head], self.bos_ids.get(head)
        prompts = []
        fallback = 0
        for ids in encoded:
            if tok.split is not None:
                ids = tok.split.expand(ids)
            fallback += tok.fallback_bytes(ids)
            if bos is not None and (not ids or ids[0] != bos):
                ids = [bos, *ids]  # Gemma and friends produce garbage without BOS
            prompts.append(tuple(ids))
        return HeadPrompt(tuple(prompts), fallback)

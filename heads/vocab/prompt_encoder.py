"""Tokenize a request's prompts with every head at once, before the router decides.

Each head's ids are kept: the chosen head's become the engine's input (never encoded twice),
and the others serve KV admission on another head (spill) and the decision record. The heads
encode in parallel threads: the Rust tokenizer releases the GIL for a batch encode.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from heads.vocab.scripts import script_class
from heads.vocab.tokenizer import HeadTokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class HeadPrompt:
    """One head's tokenization of a request's prompts."""

    ids: tuple[tuple[int, ...], ...]  # per prompt text, BOS included where the head has one
    fallback_bytes: int  # prompt bytes spelled with byte-fallback tokens, all prompts

    @property
    def tokens(self) -> int:
        return sum(len(p) for p in self.ids)


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
        out = {h: self._prompt(h, encoded[id(self._root(h))]) for h in names}
        return EncodedPrompt(texts, sum(len(t.encode()) for t in texts),
                             script_class("".join(texts)), out)

    def _root(self, head: str) -> HeadTokenizer:
        tok = self.tokenizers[head]
        return tok.encoder if tok.split is not None and tok.encoder is not None else tok

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

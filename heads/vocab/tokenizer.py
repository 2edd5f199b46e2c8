"""The tokenizer of one head, and incremental detokenization for streaming."""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from heads.errors import TokenizerError
from heads.vocab.specials import spelled_specials
from heads.vocab.split_table import SHORT_IDS, SplitTable

log = logging.getLogger(__name__)

# Lone surrogates are legal in a Python str (JSON "\ud800" decodes to one) but have no UTF-8
# form. We reject them rather than substitute U+FFFD: silently changing the prompt would
# make the model answer text the client never sent.
_SURROGATE = re.compile("[\ud800-\udfff]")
_BYTE_TOKEN = re.compile("<0x[0-9A-Fa-f]{2}>")  # SentencePiece-style byte fallback


@dataclass(frozen=True, slots=True)
class HeadTokenizer:
    tokenizer: Tokenizer
    vocab_size: int  # V: every id this tokenizer can emit is < V
    source: str = "<memory>"  # file name for error messages
    # A boundary-preserving head encodes with the native head's tokenizer (`encoder`) and
    # re-spells the ids outside this head through `split`; `tokenizer` then only decodes
    # (it has the same strings for ids < V).
    split: SplitTable | None = None
    encoder: HeadTokenizer | None = None
    # A copy that treats special-token text as plain text, for untrusted input.
    _plain: Tokenizer = field(init=False, repr=False, compare=False)
    # [V] bool: ids of byte-fallback tokens (`<0xXX>`), each spelling one byte of the text.
    _byte_ids: np.ndarray = field(init=False, repr=False, compare=False)
    _byte_set: frozenset[int] = field(init=False, repr=False, compare=False)
    # Split heads only: [V_native] int32, bytes of byte-fallback tokens in each native id's
    # spelling here; with the table's piece counts, a prompt is counted without spelling it.
    _native_fallback: np.ndarray | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # A tokenizer.json may carry truncation or padding; either would change encodings
        # behind the engine's back.
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        vocab = self.tokenizer.get_vocab(with_added_tokens=True)
        if not vocab:
            raise TokenizerError(f"{self.source}: empty vocabulary")
        token, top = max(vocab.items(), key=lambda kv: kv[1])
        if top >= self.vocab_size:
            raise TokenizerError(
                f"{self.source}: token {token!r} has id {top} >= head vocab_size {self.vocab_size}"
            )
        if (self.split is None) != (self.encoder is None):
            raise TokenizerError(f"{self.source}: a split table needs its encoder, and back")
        if self.split is not None and self.encoder is not None:
            if (self.split.vocab_size, self.split.native_size) != (
                    self.vocab_size, self.encoder.vocab_size):
                raise TokenizerError(
                    f"{self.source}: split table maps V={self.split.native_size} to "
                    f"V={self.split.vocab_size}, not {self.encoder.vocab_size} to "
                    f"{self.vocab_size}")
            plain = self.tokenizer  # never encodes: the encoder does
        else:
            plain = spelled_specials(self.tokenizer)
        object.__setattr__(self, "_plain", plain)
        byte_set = frozenset(i for t, i in vocab.items() if _BYTE_TOKEN.fullmatch(t))
        byte_ids = np.zeros(self.vocab_size, dtype=bool)
        byte_ids[list(byte_set)] = True
        object.__setattr__(self, "_byte_ids", byte_ids)
        object.__setattr__(self, "_byte_set", byte_set)
        native_fallback = None
        if self.split is not None:
            native_fallback = np.add.reduceat(byte_ids[self.split.pieces].astype(np.int32),
                                              self.split.offsets[:-1])
        object.__setattr__(self, "_native_fallback", native_fallback)

    @classmethod
    def from_file(cls, path: Path, vocab_size: int) -> HeadTokenizer:
        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises plain Exception for every load failure
            raise TokenizerError(f"{path}: cannot load tokenizer: {e}") from e
        return cls(tok, vocab_size, str(path))

    def token_to_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.tokenizer.id_to_token(token_id)

    def special_id(self, text: str) -> int | None:
        """The id of the special token spelled exactly `text` (`<bos>`), else None."""
        tid = self.tokenizer.token_to_id(text)
        if tid is None:
            return None
        added = self.tokenizer.get_added_tokens_decoder().get(tid)
        return tid if added is not None and added.special else None

    def encode(self, text: str) -> list[int]:
        """Untrusted text: `<|im_end|>` typed by a user is spelled in ordinary tokens.

        Parsing it as the special token would let a prompt forge chat turns or end the
        conversation (prompt injection). Never adds BOS or other template tokens.
        """
        if self.split is not None and self.encoder is not None:
            return self.split.expand(self.encoder.encode(text))
        _check_text(text)
        return self._plain.encode(text, add_special_tokens=False).ids

    def encode_with_specials(self, text: str) -> list[int]:
        """Text we rendered ourselves (a chat template), where special-token text is real."""
        if self.split is not None and self.encoder is not None:
            return self.split.expand(self.encoder.encode_with_specials(text))
        _check_text(text)
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str], specials: bool = False) -> list[list[int]]:
        """`encode` (or, with `specials`, `encode_with_specials`) of each text. The Rust side
        runs without the GIL and skips the offsets, so other heads can encode meanwhile."""
        if self.split is not None and self.encoder is not None:
            split = self.split
            return [split.expand(ids) for ids in self.encoder.encode_batch(texts, specials)]
        for text in texts:
            _check_text(text)
        tok = self.tokenizer if specials else self._plain
        return [e.ids for e in tok.encode_batch_fast(list(texts), add_special_tokens=False)]

    def count_native(self, native: np.ndarray) -> tuple[int, int]:
        """(len, fallback_bytes) of this split head's ids for the native ids `native` (int64),
        read from the split table without spelling them: what `expand` would give."""
        assert self.split is not None and self._native_fallback is not None
        return (int(self.split.lengths[native].sum()),
                int(self._native_fallback[native].sum()))

    def fallback_bytes(self, ids: Sequence[int]) -> int:
        """Bytes of text these ids spell with byte-fallback tokens."""
        if len(ids) < SHORT_IDS:
            byte_set = self._byte_set
            return sum(1 for i in ids if i in byte_set)
        return int(self._byte_ids[np.asarray(ids, dtype=np.int64)].sum())

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        # tokenizers skips unknown ids silently; an out-of-range id is a bug upstream.
        if ids and not 0 <= min(ids) <= max(ids) < self.vocab_size:
            raise TokenizerError(f"{self.source}: token ids outside [0, {self.vocab_size})")
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)


def vocab_fingerprint(tok: Tokenizer) -> str:
    """sha256 of the token strings in id order: names one vocabulary and its id order."""
    by_id = sorted(tok.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
    return hashlib.sha256("\0".join(t for t, _ in by_id).encode()).hexdigest()


def _check_text(text: str) -> None:
    if (m := _SURROGATE.search(text)) is not None:
        raise TokenizerError(
            f"text has a lone surrogate U+{ord(m.group()):04X} at index {m.start()}; "
            "it cannot be encoded as UTF-8"
        )


class IncrementalDetokenizer:
    """Turns a stream of ids into text deltas whose concatenation is `decode(all ids)`.

    As in vLLM, each step decodes only the window from `_prefix` (the ids before the last
    emitted chunk, kept for context such as leading-space rules) to the end, and emits the
    part past `_read`. A window whose text ends in U+FFFD may be an incomplete UTF-8 sequence
    (byte tokens split multi-byte characters), so it is held back until more ids arrive.
    Steady state is O(1) per id. Only output that stays undecodable for many ids in a row
    (garbage bytes) makes the window, and so the step cost, grow with it.

    Exact for byte-level BPE. With byte fallback, tokenizers' decoder replaces a whole run
    of `<0xXX>` tokens when any of it is invalid UTF-8, so for invalid runs the deltas can
    differ from a full decode; valid text is exact.
    """

    __slots__ = ("_tok", "_skip", "_ids", "_prefix", "_read", "_prefix_text")

    def __init__(self, tok: HeadTokenizer, skip_special_tokens: bool = True) -> None:
        self._tok = tok
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # start of the decode window
        self._read = 0  # ids before this index have been emitted
        self._prefix_text = ""  # decode of ids[_prefix:_read]

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        text = self._tok.decode(self._ids[self._prefix:], self._skip)
        if len(text) <= len(self._prefix_text) or text.endswith("\ufffd"):
            return ""
        return self._emit(text)

    def flush(self) -> str:
        """The held-back rest; call once when the stream ends."""
        if self._read == len(self._ids):
            return ""
        return self._emit(self._tok.decode(self._ids[self._prefix:], self._skip))

    def _emit(self, text: str) -> str:
        delta = text[len(self._prefix_text):]
        self._prefix, self._read = self._read, len(self._ids)
        # Decoded again rather than set to `delta`: decoders such as Metaspace treat the
        # first token of a window differently.
        self._prefix_text = self._tok.decode(self._ids[self._prefix:self._read], self._skip)
        return delta

"""Special tokens in untrusted text: a tokenizer copy that spells their text as text.

A client's prompt or a corpus file may contain "<bos>" or "<|im_end|>" as characters; encoded
by the original tokenizer they would become control tokens. The copy still reports character
offsets, which measurement and adaptation match spans by.
"""

from __future__ import annotations

from tokenizers import Tokenizer


def spelled_specials(tok: Tokenizer) -> Tokenizer:
    out = Tokenizer.from_str(tok.to_str())
    out.encode_special_tokens = True
    return out

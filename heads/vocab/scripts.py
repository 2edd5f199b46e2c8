"""The Unicode script class of a text, from a histogram of its letters' scripts.

Compression differs by script far more than by head (a 32k head spells Russian in byte
tokens), so the router learns output bytes/token per (head, script class). Counting works on
the UTF-8 bytes with numpy, without decoding each character: a few µs for 2 KB.

Classes: latin, greek, cyrillic, hebrew, arabic, devanagari, indic (other Brahmic scripts),
thai, han, kana (Japanese: kana with or without kanji), hangul; "unknown" when the text has
no letters of these (digits, punctuation, emoji only).
"""

from __future__ import annotations

import logging
import re

import numpy as np

log = logging.getLogger(__name__)

SCRIPTS = ("latin", "greek", "cyrillic", "hebrew", "arabic", "devanagari", "indic", "thai",
           "han", "kana", "hangul")
UNKNOWN = "unknown"
KANA_SHARE = 0.1  # of han + kana letters: Japanese prose is mostly kana, Chinese has none


def _lead_table() -> np.ndarray:
    """Script index (into SCRIPTS, -1 for none) of each ASCII byte and 2-byte lead byte."""
    t = np.full(256, -1, dtype=np.int8)
    latin, greek, cyrillic, hebrew, arabic = (SCRIPTS.index(s) for s in
                                              ("latin", "greek", "cyrillic", "hebrew", "arabic"))
    t[ord("A"):ord("Z") + 1] = latin
    t[ord("a"):ord("z") + 1] = latin
    t[0xC3:0xCA] = latin  # U+00C0–U+027F: Latin-1 letters, Latin Extended-A/B
    t[0xCE:0xD0] = greek  # U+0380–U+03FF
    t[0xD0:0xD5] = cyrillic  # U+0400–U+052F
    t[0xD7] = hebrew  # U+05C0–U+05FF
    t[0xD8:0xDC] = arabic  # U+0600–U+06FF
    return t


_LEADS = _lead_table()


def script_histogram(text: str) -> dict[str, int]:
    """Letters per script class (only classes present)."""
    b = np.frombuffer(text.encode("utf-8", "replace"), dtype=np.uint8)
    counts = np.bincount(_LEADS[b].astype(np.int64) + 1, minlength=len(SCRIPTS) + 1)[1:]
    out = {s: int(n) for s, n in zip(SCRIPTS, counts, strict=True) if n}
    # 3-byte sequences: the lead byte and the next one name the block.
    lead = np.flatnonzero((b >= 0xE0) & (b < 0xF0))
    lead = lead[lead + 1 < len(b)]
    if lead.size:
        hi, nxt = b[lead], b[lead + 1]
        blocks = {
            "devanagari": (hi == 0xE0) & (nxt >= 0xA4) & (nxt <= 0xA5),  # U+0900–U+097F
            "indic": (hi == 0xE0) & (nxt >= 0xA6) & (nxt <= 0xB7),  # U+0980–U+0DFF
            "thai": (hi == 0xE0) & (nxt >= 0xB8) & (nxt <= 0xB9),  # U+0E00–U+0E7F
            "latin": (hi == 0xE1) & (nxt >= 0xB8) & (nxt <= 0xBB),  # U+1E00–U+1EFF
            "kana": (hi == 0xE3) & (nxt >= 0x81) & (nxt <= 0x83),  # U+3040–U+30FF
            "han": ((hi == 0xE3) & (nxt >= 0x90)) | ((hi >= 0xE4) & (hi <= 0xE9)),
            "hangul": ((hi == 0xEA) & (nxt >= 0xB0)) | (hi == 0xEB) | (hi == 0xEC)
            | ((hi == 0xED) & (nxt <= 0x9E)),  # U+AC00–U+D7A3
        }
        for name, mask in blocks.items():
            if n := int(mask.sum()):
                out[name] = out.get(name, 0) + n
    return out


_ASCII_LETTER = re.compile(r"[A-Za-z]")


def script_class(text: str) -> str:
    """The dominant script class of `text`; Japanese text counts as kana."""
    if text.isascii():  # the common case, without numpy's fixed cost: Latin letters or none
        return "latin" if _ASCII_LETTER.search(text) else UNKNOWN
    hist = script_histogram(text)
    if not hist:
        return UNKNOWN
    kana, han = hist.get("kana", 0), hist.get("han", 0)
    if kana and kana >= KANA_SHARE * (kana + han):
        hist["kana"] = kana + han  # the kanji of Japanese text
        hist.pop("han", None)
    return max(hist, key=hist.__getitem__)

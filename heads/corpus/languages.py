"""Languages of the multilingual evaluation and the committed per-language samples.

Each sample (`heads/data/multilingual/<lang>.txt`) is a few KB of held-out prose from the
corpus source of that language (attribution in heads/data/README.md), so tests and replays
measure per-language quality without downloading anything. `write_samples` regenerates
them from a `polyhead corpus build --languages ...` output.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from heads.data.files import SAMPLES_DIR
from heads.errors import CorpusError

log = logging.getLogger(__name__)

SAMPLE_BYTES = 10_000  # target size of a committed sample (whole paragraphs, at most this)

# Language code -> writing system, named as heads.vocab.scripts classes (the router's): "kana" is
# Japanese, kana with kanji. The code is what requests and samples are keyed by; "zh" is
# Simplified Chinese (zh_CN), "pt-br" Brazilian Portuguese.
SCRIPTS: dict[str, str] = {
    "en": "latin", "de": "latin", "fr": "latin", "es": "latin", "it": "latin",
    "nl": "latin", "pl": "latin", "pt-br": "latin", "cs": "latin",
    "ru": "cyrillic", "uk": "cyrillic",
    "ja": "kana", "zh": "han", "ko": "hangul", "hi": "devanagari",
}

# Writing system -> code point ranges whose letters count as that script.
_RANGES: dict[str, tuple[tuple[int, int], ...]] = {
    "latin": ((0x41, 0x5A), (0x61, 0x7A), (0xC0, 0x24F)),
    "cyrillic": ((0x400, 0x52F),),
    "han": ((0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF)),
    "kana": ((0x3040, 0x30FF), (0x31F0, 0x31FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF)),
    "hangul": ((0x1100, 0x11FF), (0x3130, 0x318F), (0xAC00, 0xD7A3)),
    "devanagari": ((0x900, 0x97F), (0xA8E0, 0xA8FF)),
}
# Scripts written without spaces between words (so a line join must not insert one).
UNSPACED = frozenset({"han", "kana"})


def script_of(lang: str) -> str:
    try:
        return SCRIPTS[lang]
    except KeyError:
        raise CorpusError(f"unknown language {lang!r}; known: {', '.join(SCRIPTS)}") from None


def _in_script(ch: str, script: str) -> bool:
    o = ord(ch)
    return any(lo <= o <= hi for lo, hi in _RANGES[script])


def script_share(text: str, script: str) -> float:
    """Fraction of the letters (str.isalpha: CJK ideographs included) that are in `script`;
    marks such as Devanagari vowel signs count too. 0.0 for text without letters."""
    letters = [c for c in text if c.isalpha() or (script == "devanagari" and _in_script(c, script))]
    if not letters:
        return 0.0
    return sum(_in_script(c, script) for c in letters) / len(letters)


def languages() -> tuple[str, ...]:
    """Languages with a committed sample, English first, then in code order."""
    have = {p.stem for p in SAMPLES_DIR.glob("*.txt")}
    return tuple(sorted(have & SCRIPTS.keys(), key=lambda c: (c != "en", c)))


def sample_path(lang: str) -> Path:
    script_of(lang)  # validates the code
    path = SAMPLES_DIR / f"{lang}.txt"
    if not path.is_file():
        raise CorpusError(f"no committed sample for {lang!r} ({path})")
    return path


def sample(lang: str) -> str:
    """The committed held-out sample of one language (UTF-8 text, paragraphs separated by a
    blank line)."""
    return sample_path(lang).read_text(encoding="utf-8")


def prose_paragraphs(text: str, lang: str, min_chars: int | None = None) -> list[str]:
    """Paragraphs of running text in `lang`'s script: long enough (default 80 characters, 30
    for CJK), mostly letters, and at least 60% of the letters in the language's script."""
    script = script_of(lang)
    low = min_chars if min_chars is not None else (30 if script in UNSPACED | {"hangul"} else 80)
    out = []
    for para in re.split(r"\n\s*\n", text):
        para = para.strip()
        visible = [c for c in para if not c.isspace()]
        if len(para) < low or not visible:
            continue
        letters = sum(c.isalpha() or _in_script(c, script) for c in visible)
        if letters / len(visible) >= 0.6 and script_share(para, script) >= 0.6:
            out.append(para)
    return out


def is_running_text(paragraph: str) -> bool:
    """One line of sentences, not a synopsis, option list or table row: no line break, and
    few words that look like options or placeholders (-x, [FILE], <arg>, a=b), and not
    starting like a roff request or quoting roff escapes (man(7) explains them)."""
    if "\n" in paragraph or "\\" in paragraph or paragraph[:1] in (".", "'"):
        return False
    words = paragraph.split()
    code = sum(w[0] in "-[<{|/$" or "=" in w or "_" in w for w in words)
    return code <= 0.1 * len(words)


def write_samples(corpus_dir: Path, sources: dict[str, str], out: Path = SAMPLES_DIR,
                  max_bytes: int = SAMPLE_BYTES) -> dict[str, int]:
    """Per language, the first running-text paragraphs (`prose_paragraphs` that pass
    `is_running_text`) of its source's held-out split, up to
    `max_bytes` of UTF-8, written to `out/<lang>.txt`. `sources` maps lang -> source name
    (e.g. "de" -> "man-de"). Returns bytes written per language; a language with less
    than half of `max_bytes` of prose held out gets no sample."""
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for lang, source in sources.items():
        held = corpus_dir / f"{source}.heldout.txt"
        if not held.is_file():
            raise CorpusError(f"{held}: missing; build it with `polyhead corpus build`")
        picked: list[str] = []
        size = 0
        for para in prose_paragraphs(held.read_text(encoding="utf-8"), lang):
            if not is_running_text(para):
                continue
            n = len(para.encode()) + 2
            if size + n > max_bytes:
                if size >= max_bytes * 0.8:
                    break
                continue  # too long to fit: try a shorter paragraph
            picked.append(para)
            size += n
        if size < max_bytes // 2:  # too small to measure anything: leave it out
            log.warning("%s: only %d bytes of %s prose; no sample written", held, size, lang)
            continue
        text = "\n\n".join(picked) + "\n"
        (out / f"{lang}.txt").write_text(text, encoding="utf-8")
        written[lang] = len(text.encode())
        log.info("%s: %d bytes from %s", lang, written[lang], held.name)
    return written

from __future__ import annotations

from pathlib import Path

import pytest

from heads.corpus.languages import (
    SCRIPTS,
    is_running_text,
    languages,
    prose_paragraphs,
    sample,
    sample_path,
    script_of,
    script_share,
    write_samples,
)
from heads.errors import CorpusError


def test_committed_samples_cover_the_scripts() -> None:
    langs = languages()
    assert langs[0] == "en" and len(langs) >= 9
    scripts = {script_of(lang) for lang in langs}
    assert {"latin", "cyrillic", "kana", "han", "devanagari", "hangul"} <= scripts
    assert {"ja", "zh", "hi", "ko"} <= set(langs)


@pytest.mark.parametrize("lang", languages())
def test_each_sample_is_clean_prose_in_its_script(lang: str) -> None:
    text = sample(lang)
    assert 6_000 <= len(text.encode()) <= 12_000
    paragraphs = text.strip().split("\n\n")
    assert len(paragraphs) >= 5
    for p in paragraphs:
        assert is_running_text(p) and p == p.strip()
        assert not p.startswith((".", "\\")) and "\\f" not in p and "\ufffd" not in p
    # Latin-script languages cannot be told apart by script; the others must be mostly theirs.
    assert script_share(text, script_of(lang)) > 0.75  # technical text: some Latin names


def test_script_of_and_share() -> None:
    assert script_of("hi") == "devanagari" and script_of("ko") == "hangul"
    assert script_of("ja") == "kana" and script_of("ru") == "cyrillic"
    assert set(SCRIPTS.values()) >= {"latin", "han"}
    with pytest.raises(CorpusError, match="unknown language"):
        script_of("xx")
    with pytest.raises(CorpusError, match="unknown language"):
        sample_path("xx")
    assert script_share("Привет, world", "cyrillic") == pytest.approx(6 / 11)
    assert script_share("नमस्ते", "devanagari") == 1.0  # vowel signs and virama count
    assert script_share("1234 !!", "latin") == 0.0


def test_prose_filter_and_running_text() -> None:
    text = ("Kurz.\n\n" + "Ein langer deutscher Satz, der als Fließtext zählt, " * 2
            + "\n\n" + "This paragraph is English, yet written in Latin letters as well. " * 2
            + "\n\n" + "Это русский абзац, который в немецком источнике не считается. " * 2)
    kept = prose_paragraphs(text, "de")
    assert len(kept) == 2 and kept[0].startswith("Ein langer")  # Latin can't tell en from de
    assert prose_paragraphs(text, "ru") == [text.split("\n\n")[3].strip()]
    assert is_running_text("Ein ganz normaler Satz mit ein paar Wörtern darin.")
    assert not is_running_text("ls [-a] [-l] [--color=WHEN] [FILE]...")
    assert not is_running_text("-a, --all\nalle Einträge zeigen")


def test_write_samples_takes_whole_prose_paragraphs(tmp_path: Path) -> None:
    para = "Dies ist ein Absatz mit genug Text, um als laufende Prosa zu gelten: Nummer {} hier."
    (tmp_path / "man-de.heldout.txt").write_text(
        "\n\n".join(["-a, --all\nzeigt alles", *(para.format(i) for i in range(200))]))
    (tmp_path / "man-nl.heldout.txt").write_text(para.format(0))
    out = tmp_path / "samples"
    written = write_samples(tmp_path, {"de": "man-de", "nl": "man-nl"}, out, max_bytes=2000)
    assert list(written) == ["de"] and not (out / "nl.txt").exists()  # too little nl prose
    text = (out / "de.txt").read_text()
    assert 1600 <= len(text.encode()) == written["de"] <= 2000
    assert text.startswith(para.format(0)) and "--all" not in text
    with pytest.raises(CorpusError, match="missing"):
        write_samples(tmp_path, {"fr": "man-fr"}, out)


def test_each_sample_is_the_script_class_the_router_sees() -> None:
    from heads.vocab.scripts import script_class

    for lang in languages():
        assert script_class(sample(lang)) == script_of(lang), lang

from __future__ import annotations

import pytest

from heads.corpus.roff import groff_available, groff_to_prose, is_redirect, man_to_prose

PAGE = rb""".\" a comment line
.TH DEMO 1 "2024" "demo 1.0" "User Commands"
.SH NAME
demo \- show a \fBbold\fR word
.SH BESCHREIBUNG
.B demo
liest die
.I Datei
und gibt sie aus.
Ein zweiter Satz im selben Absatz.
.PP
Zweiter Absatz mit \(Fo Zitat \(Fc und \-\-option.
.TP
.BR \-a ", " \-\-all
alle Eintr\(:age zeigen
"""

RENDERED = """DEMO(1)            User Commands            DEMO(1)



NAME
       demo - show a word

BESCHREIBUNG
       Erster    Absatz,   mit Spalten.

       -a, --all
              alle Einträge



demo 1.0            2024            DEMO(1)
"""


def test_groff_to_prose_drops_header_footer_headings_and_padding() -> None:
    assert groff_to_prose(RENDERED) == [
        "demo - show a word", "Erster Absatz, mit Spalten.", "-a, --all\nalle Einträge"]
    assert groff_to_prose("only a header\n\n") == []


def test_unspaced_scripts_lose_the_line_join_space() -> None:
    rendered = "LS(1)  x  LS(1)\n説明\n       一覧 表示します。 -a と ls を\n\nfoot  LS(1)\n"
    assert groff_to_prose(rendered, unspaced=True) == ["一覧表示します。 -a と ls を"]
    assert groff_to_prose(rendered) == ["一覧 表示します。 -a と ls を"]


def test_alias_pages_are_skipped() -> None:
    assert is_redirect(b".so man1/other.1\n")
    assert man_to_prose(b"  .so man3/foo.3\n") == []


@pytest.mark.skipif(not groff_available(), reason="groff not installed")
def test_man_to_prose_renders_with_groff_and_leaves_no_roff() -> None:
    paragraphs = man_to_prose(PAGE)
    text = "\n\n".join(paragraphs)
    assert paragraphs[0] == "demo - show a bold word"
    assert "demo liest die Datei und gibt sie aus. Ein zweiter Satz im selben Absatz." in text
    assert "«" in text and "»" in text and "--option" in text and "Einträge" in text
    assert "BESCHREIBUNG" not in text and "DEMO(1)" not in text
    for line in text.splitlines():
        assert not line.startswith((".", "'")) and "\\f" not in line and "\\(" not in line
        assert "\x1b" not in line and "\b" not in line and not line.startswith(" ")


@pytest.mark.skipif(not groff_available(), reason="groff not installed")
def test_man_page_source_extracts_pages_and_drops_repeated_paragraphs(tmp_path) -> None:
    import gzip

    from heads.corpus.localized import help_pages, man_pages

    credit = (b".SH \\(:UBERSETZUNG\n"
              b"Diese \\(:Ubersetzung ist Freie Dokumentation; lesen Sie die GPL.\n")
    man1 = tmp_path / "usr/share/man/de/man1"
    man1.mkdir(parents=True)
    (man1 / "demo.1.gz").write_bytes(gzip.compress(PAGE + credit))
    (man1 / "zwei.1").write_bytes(PAGE.replace(b"demo", b"zwei") + credit)
    (man1 / "alias.1.gz").write_bytes(gzip.compress(b".so man1/demo.1\n"))
    docs = dict(man_pages("de", "de")(tmp_path))
    assert list(docs) == ["man1/demo.1.gz", "man1/zwei.1"]  # the alias stub has no text
    assert "Übersetzung ist Freie Dokumentation" in docs["man1/demo.1.gz"]
    assert "Übersetzung" not in docs["man1/zwei.1"]  # repeated boilerplate counted once
    assert "zwei liest die Datei und gibt sie aus." in docs["man1/zwei.1"]

    html = tmp_path / "usr/share/libreoffice/help/hi/text/shared/a.html"
    html.parent.mkdir(parents=True)
    html.write_text("<html><body>\n<p>LibreOffice Help</p>\n<p>" + "यह एक हिंदी वाक्य है। " * 4
                    + "</p>\n<p>" + "An untranslated English paragraph stays out. " * 2
                    + "</p>\n</body></html>", encoding="utf-8")
    ((key, text),) = help_pages("hi")(tmp_path)
    assert key == "shared/a.html" and text.startswith("यह एक हिंदी") and "English" not in text

from __future__ import annotations

import pytest

from heads.roff import groff_available, groff_to_prose, is_redirect, man_to_prose

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

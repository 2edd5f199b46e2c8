from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from heads.corpus.builder import build_corpus
from heads.corpus.splits import corpus_files, source_name, split_of
from heads.corpus.text import html_to_text, pod_to_text, read_text
from heads.errors import CorpusError


def test_pod_to_text_keeps_headings_and_drops_markup() -> None:
    pod = "=head1 NAME\n\nperlfoo - B<bold> and C<code> with L<perlsyn/x>\n\n=cut\n"
    assert pod_to_text(pod) == "NAME\n\nperlfoo - bold and code with perlsyn/x"


def test_html_to_text_skips_scripts_and_breaks_blocks() -> None:
    text = html_to_text("<html><head><title>t</title></head><body><p>One &amp; two</p>"
                        "<script>var x;</script><p>three</p></body></html>")
    assert text == "One & two\nthree"


def test_read_text_decompresses_and_dispatches_on_suffix(tmp_path: Path) -> None:
    path = tmp_path / "a.pod.gz"
    path.write_bytes(gzip.compress(b"=head1 X\n\nI<y>\n"))
    assert read_text(path) == "X\n\ny"


def test_split_is_deterministic_and_about_five_percent() -> None:
    keys = [str(i) for i in range(4000)]
    held = [k for k in keys if split_of("wiki", k) == "heldout"]
    assert held == [k for k in keys if split_of("wiki", k) == "heldout"]
    assert 120 < len(held) < 280


def test_build_from_user_files(tmp_path: Path) -> None:
    src = tmp_path / "notes.txt"
    src.write_text("\n\n".join(f"paragraph {i} ünïcode" for i in range(400)))
    (summary,) = build_corpus(tmp_path / "out", [src])
    assert summary.name == "notes" and sum(summary.documents.values()) == 400
    train, held = (tmp_path / "out" / f"notes.{s}.txt" for s in ("train", "heldout"))
    assert summary.bytes["heldout"] == len(held.read_bytes()) > 0
    assert corpus_files(tmp_path / "out", "heldout") == [held]
    assert source_name(held) == source_name(train) == "notes"
    with pytest.raises(CorpusError, match="no \\*.train.txt"):
        corpus_files(tmp_path, "train")
    with pytest.raises(CorpusError, match="not a file"):
        build_corpus(tmp_path / "o2", [tmp_path / "missing.txt"])


def test_sources_are_english_by_default_and_opt_in_per_language() -> None:
    from heads.corpus.builder import all_sources, select_sources
    from heads.corpus.english import SOURCES
    from heads.corpus.languages import script_of

    assert select_sources() == SOURCES and {s.language for s in SOURCES} == {"en"}
    picked = select_sources(["de", "ja"])
    assert [s.name for s in picked] == ["man-de", "man-ja"]
    assert [s.language for s in picked] == ["de", "ja"]
    assert [s.name for s in select_sources(["en", "hi"], ["wiki", "lohelp-hi"])] == [
        "wiki", "lohelp-hi"]
    every = select_sources(["all"])
    assert every == all_sources() and len({s.name for s in every}) == len(every)
    scripts = {script_of(s.language) for s in every}
    assert {"latin", "cyrillic", "kana", "han", "devanagari", "hangul"} <= scripts
    with pytest.raises(CorpusError, match="no corpus source for xx"):
        select_sources(["de", "xx"])
    with pytest.raises(CorpusError, match="unknown source"):
        select_sources(["de"], ["man-fr"])


def test_corpus_index_keeps_sources_built_earlier(tmp_path: Path) -> None:
    import json

    a, b = tmp_path / "alpha.txt", tmp_path / "beta.txt"
    a.write_text("one\n\ntwo")
    b.write_text("three")
    out = tmp_path / "out"
    build_corpus(out, [a])
    build_corpus(out, [b])
    index = json.loads((out / "corpus.json").read_text())
    assert [s["name"] for s in index["sources"]] == ["alpha", "beta"]
    assert all(s["language"] == "en" for s in index["sources"])

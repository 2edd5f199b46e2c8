"""The README and docs/ cannot rot: every relative link resolves (to a file, and to a heading
when it names an anchor), every page stays within its length, every `--flag` a page writes
in a `polyhead ...` command is one that subcommand's `--help` lists, and the README's quick
start holds only what its runnable tier (tests/server/test_readme_examples.py) can run.

Fast: no server, no subprocess; the CLI's argparse parser is built in process.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

import pytest

from server.cli import _parser
from tests.server.readme_util import commands, python_blocks, quick_start

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 200  # a front door: what it is, a quick start, where the rest is
PAGE_MAX_LINES = 400  # one subject per page

FENCE = re.compile(r"^(`{3,}|~{3,}).*?^\1[ \t]*$", re.S | re.M)
INDENTED = re.compile(r"(?:^(?: {4}|\t).*\n?)+", re.M)  # an indented code block's lines
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def prose(text: str) -> str:
    """The text with fenced blocks and inline code blanked: links and headings live outside
    code, and a `#` line inside a bash block is a comment, not a heading."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return INLINE_CODE.sub(lambda m: " " * len(m.group(0)), text)


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text (link targets, code and emphasis marks
    dropped), lower-cased, punctuation other than `-` and `_` removed, each space a `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[`*]", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor; a repeated one gets -1, -2, ... as on GitHub."""
    seen: Counter[str] = Counter()
    found = set()
    for m in HEADING.finditer(FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)):
        slug = github_slug(m.group(2))
        found.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return found


def broken_links(page: Path) -> list[str]:
    problems = []
    for m in LINK.finditer(prose(page.read_text())):
        target = m.group(1)
        if SCHEME.match(target):  # http(s), mailto: not this test's business
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        where = f"{rel(page)}: [{m.group(0)}]"
        if not dest.exists():
            problems.append(f"{where} -> {rel(dest)} does not exist")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            problems.append(f"{where} -> no heading #{anchor} in {rel(dest)}")
    return problems


def code_texts(text: str) -> list[str]:
    """Each command-sized piece of code in a page: every line of its fenced and indented
    blocks (continuation lines joined), and every inline code span."""
    pieces = []
    for block in [m.group(0) for m in FENCE.finditer(text)] + INDENTED.findall(
            FENCE.sub("", text)):
        pieces += block.replace("\\\n", " ").splitlines()
    pieces += [m.group(2).replace("\n", " ") for m in INLINE_CODE.finditer(FENCE.sub("", text))]
    return pieces


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return {name: sub for action in parser._actions
            if isinstance(action, argparse._SubParsersAction)
            for name, sub in action.choices.items()}


def help_flags(parser: argparse.ArgumentParser) -> set[str]:
    """The long options `--help` lists."""
    return {o for a in parser._actions if a.help != argparse.SUPPRESS
            for o in a.option_strings if o.startswith("--")}


def unknown_flags(code: str, root: argparse.ArgumentParser) -> list[str]:
    """`polyhead SUB ... --flag` in one piece of code, each flag its subcommand's --help does
    not list. A shell separator or comment ends the command; `|` does not (synopses write
    alternatives with it)."""
    words = code.split()
    problems = []
    for start in (i for i, w in enumerate(words) if w == "polyhead"):
        parser, path = root, ["polyhead"]
        rest = words[start + 1:]
        while rest and rest[0] in subcommands(parser):
            parser = subcommands(parser)[rest[0]]
            path.append(rest.pop(0))
        for word in rest:
            if word in ("&&", "||", ";", "polyhead") or word.startswith("#"):
                break
            flag = re.match(r"[\[(]*(--[a-z0-9][a-z0-9-]*)", word)
            if flag and flag.group(1) not in help_flags(parser):
                problems.append(f"{' '.join(path)} has no {flag.group(1)}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_relative_link_resolves(page: Path) -> None:
    assert not broken_links(page), "\n".join(broken_links(page))


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_the_page_fits_its_length(page: Path) -> None:
    limit = README_MAX_LINES if page == README else PAGE_MAX_LINES
    lines = len(page.read_text().splitlines())
    assert lines <= limit, f"{rel(page)} is {lines} lines, over {limit}: split or condense it"


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_cli_flag_named_exists(page: Path) -> None:
    root = _parser()
    problems = [f"{rel(page)}: `{code.strip()}`: {p}"
                for code in code_texts(page.read_text()) for p in unknown_flags(code, root)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_no_issue_numbers_or_files_outside_the_repository(page: Path) -> None:
    text = page.read_text()
    found = re.findall(r"\bDESIGN\.md\b|\b(?:issue|PR|pull request)\s*#?\d+\b", text, re.I)
    assert not found, f"{rel(page)} names {found}"


def test_the_readme_starts_with_the_two_set_up_commands() -> None:
    lines = README.read_text().splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.strip() and not ln.startswith("# "))
    block = lines[first:first + 4]
    assert block[0] == "```bash" and block[3] == "```", block
    assert block[1].startswith("make serve ") and block[2].startswith("make test "), block


def test_every_quick_start_command_is_one_the_readme_tier_runs() -> None:
    """The tier runs curl lines (with the exports) and Python blocks; anything else in the
    quick start would go unchecked."""
    exports, curls, others = commands(quick_start())
    assert not others, f"the README tier cannot run {others}; use curl or a Python block"
    assert curls and "POLYHEAD_ADMIN_TOKEN" in exports
    assert any("gemma3-270m:" in " ".join(c) for c in curls), "no curl pins a head"
    assert any("/admin/policy" in " ".join(c) and "PUT" in c for c in curls)
    assert [b for b in python_blocks(quick_start()) if "from openai import OpenAI" in b]


# The checks above must be able to fail: each runs here on a page made to break it.

def test_a_missing_file_and_a_missing_heading_are_caught(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## The `--x` flag: on/off\n")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n[ok](other.md#the---x-flag-onoff) [self](#page)\n"
                    "[gone](missing.md) [bad](other.md#nowhere) `[code](missing.md)`\n"
                    "```\n[fenced](missing.md)\n```\n")
    problems = broken_links(page)
    assert len(problems) == 2, problems
    assert "missing.md does not exist" in problems[0] and "#nowhere" in problems[1]


def test_repeated_headings_get_numbered_anchors() -> None:
    assert anchors("# A\n## A\n## A b\n") == {"a", "a-1", "a-b"}


def test_an_unknown_flag_is_caught() -> None:
    root = _parser()
    assert unknown_flags("polyhead heads eval DIR --grouped --no-such-flag", root) == [
        "polyhead heads eval has no --no-such-flag"]
    assert unknown_flags("polyhead serve [--model DIR] (--port P | --host H)", root) == []
    assert unknown_flags("polyhead export vllm X --out D && vllm serve --dtype auto", root) == []

"""docs/request-path.md against the code: at most 8 files from the /v1/completions route to
the engine and back, each one existing, and each handed the request by the entry it names,
which imports it (or the protocol it implements) and makes the call it names."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "request-path.md"
MAX_FILES = 8
ENTRY = re.compile(r"^(\d+)\. `([^`]+\.py)` — (?:called by (\d+) as `(\w+)`)?")


@dataclass(frozen=True)
class Entry:
    number: int
    path: str
    caller: int | None  # the entry that hands the request on to this file
    call: str | None  # what the caller calls, defined in this file


def entries(text: str) -> list[Entry]:
    out = []
    for line in text.splitlines():
        m = ENTRY.match(line)
        if m:
            out.append(Entry(int(m[1]), m[2], int(m[3]) if m[3] else None, m[4]))
    return out


def _module(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def _imports(tree: ast.Module, module: str) -> dict[str, str]:
    """Every module the file imports, and each name it imports -> the module it came from
    (`from a import b` counts a and, should b be a module, a.b)."""
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update({a.name: a.name for a in node.names})
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.rsplit(".", node.level)[0]
                base = f"{package}.{base}" if base else package
            found[base] = base
            for a in node.names:
                found.setdefault(f"{base}.{a.name}", base)
                found[a.asname or a.name] = base
    return found


def _calls(tree: ast.Module) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name):
                out.add(f.id)
            elif isinstance(f, ast.Attribute):
                out.add(f.attr)
    return out


def _defines(tree: ast.Module) -> set[str]:
    return {n.name for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}


def _base_modules(tree: ast.Module, module: str) -> set[str]:
    """The modules this file's classes take their base classes from: a caller that imports
    one reaches the class through that protocol, as the gateway reaches a backend."""
    imported = _imports(tree, module)
    return {imported[b.id] for c in ast.walk(tree) if isinstance(c, ast.ClassDef)
            for b in c.bases if isinstance(b, ast.Name) and b.id in imported}


def _routes(tree: ast.Module) -> set[str]:
    return {d.args[0].value for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
            for d in n.decorator_list if isinstance(d, ast.Call) and d.args
            and isinstance(d.args[0], ast.Constant)}


def problems(text: str, root: Path = ROOT) -> list[str]:
    listed = entries(text)
    if not listed:
        return ["no numbered list of files"]
    out = []
    if [e.number for e in listed] != list(range(1, len(listed) + 1)):
        out.append("the list is not numbered 1, 2, 3, ...")
    if len(listed) > MAX_FILES:
        out.append(f"{len(listed)} files; at most {MAX_FILES}")
    if not any(e.path.startswith("heads/engine/") for e in listed):
        out.append("the list never reaches the engine (heads/engine/)")
    trees: dict[int, ast.Module] = {}
    for e in listed:
        if not (root / e.path).is_file():
            out.append(f"{e.number}: {e.path} does not exist")
        else:
            trees[e.number] = ast.parse((root / e.path).read_text(), e.path)
    if out:
        return out
    first = listed[0]
    if first.caller is not None or "/v1/completions" not in _routes(trees[1]):
        out.append(f"1: {first.path} is not the /v1/completions route")
    for e in listed[1:]:
        if e.caller is None or e.call is None or not 1 <= e.caller < e.number:
            out.append(f"{e.number}: {e.path} names no earlier caller and call")
            continue
        caller, callee = listed[e.caller - 1], trees[e.number]
        imported = _imports(trees[e.caller], _module(caller.path))
        if _module(e.path) not in imported \
                and not _base_modules(callee, _module(e.path)) & set(imported):
            out.append(f"{e.number}: {caller.path} does not import {e.path} "
                       "(nor a protocol it implements)")
        if e.call not in _calls(trees[e.caller]):
            out.append(f"{e.number}: {caller.path} does not call {e.call}")
        if e.call not in _defines(callee):
            out.append(f"{e.number}: {e.path} does not define {e.call}")
    return out


def test_the_documented_path_matches_the_code() -> None:
    text = DOC.read_text()
    assert len(text.splitlines()) < 150
    assert problems(text) == []


@pytest.mark.parametrize(("change", "found"), [
    # A file that no longer exists (as when a module is merged away).
    (("`server/api/completion_body.py`", "`server/api/responses.py`"), "does not exist"),
    # A caller that does not import the file it is said to hand the request to.
    (("called by 4 as `generate`", "called by 3 as `generate`"), "does not import"),
    # A call that is not made, or not defined where the list says.
    (("called by 2 as `completion`", "called by 2 as `plan_chat_completion`"),
     "does not call"),
    (("called by 1 as `CompletionBody`", "called by 1 as `JSONResponse`"), "does not define"),
])
def test_a_drifted_list_is_caught(change: tuple[str, str], found: str) -> None:
    text = DOC.read_text()
    old, new = change
    assert old in text
    assert any(found in p for p in problems(text.replace(old, new)))


def test_more_than_eight_files_are_caught() -> None:
    text = DOC.read_text()
    extra = "".join(f"{n}. `server/gateway/gateway.py` — called by 1 as `admit`: again\n"
                    for n in range(len(entries(text)) + 1, MAX_FILES + 2))
    assert any("at most" in p for p in problems(text + extra))

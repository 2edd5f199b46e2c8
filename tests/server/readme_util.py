"""The documented requests as runnable examples: the curl lines and Python blocks of the
README's quick start and of the docs pages that show requests, parsed from the pages
themselves, a venv holding only what `make serve` installs, and curl run as written."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
QUICK_START = "Quick start"
# The pages whose ```bash blocks are requests to a running server, each run in order: the
# README's quick start first (it exports the admin token the others use), then whole pages.
RUNNABLE = ((README, QUICK_START), (ROOT / "docs" / "api.md", None),
            (ROOT / "docs" / "routing.md", None), (ROOT / "docs" / "operations.md", None))
# `make install VENV=.venv-readme`: `make serve`'s install (pip install -e ., no extras) in a
# venv of its own, ignored by git; the Makefile's stamp makes a rerun instant.
VENV = ROOT / ".venv-readme"
# The pages' examples name the demo; the tier serves the tiny model (built in seconds).
DEMO_TO_TINY = {"gemma3-270m": "tiny", "32k": "1k", "131k": "4k", "262k": "8k"}
DEMO_ADDRESS = re.compile(r"(?:http://)?(?:127\.0\.0\.1|localhost):8000")
DEMO_NAME = re.compile(r"(?<![\w.-])(" + "|".join(map(re.escape, DEMO_TO_TINY)) + r")(?![\w-])")


def make_install(venv: Path = VENV, timeout_s: float = 900) -> Path:
    """`make install VENV=...` from the repository root, as `make serve` runs it. A parent
    make's MAKEFLAGS (`make test ARGS=...`) must not reach this one."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    subprocess.run(["make", "--no-print-directory", "install", f"VENV={venv}"], cwd=ROOT,
                   env=env, check=True, timeout=timeout_s, capture_output=True)
    return venv


def section(text: str, title: str) -> str:
    """The "## title" section of a page, its ### subsections included."""
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def runnable_text(page: Path, title: str | None) -> str:
    text = page.read_text()
    return text if title is None else section(text, title)


def quick_start() -> str:
    return runnable_text(README, QUICK_START)


def shell_lines(text: str) -> list[str]:
    """Each command of the text's fenced bash blocks, continuation lines joined."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        lines += [ln.strip() for ln in block.replace("\\\n", " ").splitlines() if ln.strip()]
    return lines


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.S)


def commands(text: str) -> tuple[dict[str, str], list[list[str]], list[list[str]]]:
    """(the variables the text exports, each curl command as its words, every other command)."""
    exports: dict[str, str] = {}
    curls: list[list[str]] = []
    others: list[list[str]] = []
    for line in shell_lines(text):
        words = shlex.split(line, comments=True)
        if words[:1] == ["export"]:
            for word in words[1:]:
                name, _, value = word.partition("=")
                exports[name] = value
        elif words[:1] == ["curl"]:
            curls.append(words)
        elif words:
            others.append(words)
    return exports, curls, others


def runnable_commands() -> tuple[dict[str, str], list[list[str]]]:
    """(every variable the runnable pages export, each of their curl commands), in order."""
    exports: dict[str, str] = {}
    curls: list[list[str]] = []
    for page, title in RUNNABLE:
        more, page_curls, _ = commands(runnable_text(page, title))
        exports.update(more)
        curls += page_curls
    return exports, curls


def aim(text: str, url: str) -> str:
    """Documented text aimed at `url` and the tiny model."""
    return DEMO_NAME.sub(lambda m: DEMO_TO_TINY[m.group(1)], DEMO_ADDRESS.sub(url, text))


def on_server(words: list[str], url: str, env: dict[str, str]) -> list[str]:
    """A documented command aimed at `url` and the tiny model, its $VARIABLES expanded."""
    def expand(word: str) -> str:
        return re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), ""), word)

    return [aim(expand(w), url) for w in words]


@dataclass(frozen=True)
class CurlAnswer:
    status: int
    headers: dict[str, str]  # lower-case names, the last response's
    body: str

    def json(self) -> object:
        return json.loads(self.body)

    def sse(self) -> list[str]:
        """The data of each server-sent event, `[DONE]` included."""
        return [ln[len("data: "):] for ln in self.body.splitlines() if ln.startswith("data: ")]


def run_curl(words: list[str], scratch: Path, env: dict[str, str]) -> CurlAnswer:
    """Run curl as the page writes it; only where its answer goes is added."""
    head, body = scratch / "headers", scratch / "body"
    done = subprocess.run([*words, "-sS", "-D", str(head), "-o", str(body),
                           "-w", "%{http_code}"], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"curl failed ({done.returncode}): {done.stderr}"
    text = body.read_bytes().decode(errors="replace")  # not read_text: it drops the \r
    if text.startswith("HTTP/"):  # `-i` writes the headers into the body too
        text = text.split("\r\n\r\n", 1)[-1]
    blocks = head.read_bytes().decode(errors="replace").strip().split("\r\n\r\n")
    headers = dict(ln.split(": ", 1) for ln in blocks[-1].splitlines()[1:] if ": " in ln)
    return CurlAnswer(int(done.stdout[-3:]), {k.lower(): v for k, v in headers.items()}, text)


def method_and_path(words: list[str]) -> tuple[str, str]:
    url = next(w for w in words[1:] if w.startswith("http"))
    data = any(w in ("-d", "--data", "--data-raw", "--json") for w in words)
    method = words[words.index("-X") + 1] if "-X" in words else ("POST" if data else "GET")
    return method, urlsplit(url).path


def data_of(words: list[str]) -> dict:
    for flag in ("-d", "--data", "--data-raw", "--json"):
        if flag in words:
            return json.loads(words[words.index(flag) + 1])
    return {}

"""The README's "Using it" requests as runnable examples: the section's curl lines parsed from
README.md itself, a venv holding only what `make serve` installs, and curl run as written."""

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
# `make install VENV=.venv-readme`: `make serve`'s install (pip install -e ., no extras) in a
# venv of its own, ignored by git; the Makefile's stamp makes a rerun instant.
VENV = ROOT / ".venv-readme"
# The README's examples name the demo; the tier serves the tiny model (built in seconds).
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


def using_it(text: str | None = None) -> str:
    """The "## Using it" section, its ### subsections included."""
    text = README.read_text() if text is None else text
    start = text.index("\n## Using it\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def shell_lines(section: str) -> list[str]:
    """Each command of the section's fenced bash blocks, continuation lines joined."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", section, re.S):
        lines += [ln.strip() for ln in block.replace("\\\n", " ").splitlines() if ln.strip()]
    return lines


def readme_commands(section: str | None = None) -> tuple[dict[str, str], list[list[str]]]:
    """(the variables the section exports, each curl command as its words)."""
    exports: dict[str, str] = {}
    curls: list[list[str]] = []
    for line in shell_lines(using_it() if section is None else section):
        words = shlex.split(line, comments=True)
        if words[:1] == ["export"]:
            for word in words[1:]:
                name, _, value = word.partition("=")
                exports[name] = value
        elif words[:1] == ["curl"]:
            curls.append(words)
    return exports, curls


def on_server(words: list[str], url: str, env: dict[str, str]) -> list[str]:
    """A README command aimed at `url` and the tiny model, its $VARIABLES expanded."""
    def expand(word: str) -> str:
        return re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), ""), word)

    return [DEMO_NAME.sub(lambda m: DEMO_TO_TINY[m.group(1)], DEMO_ADDRESS.sub(url, expand(w)))
            for w in words]


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
    """Run curl as the README writes it; only where its answer goes is added."""
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

"""polyhead bench chat: the first answer to each of a fixed set of chat prompts.

Each prompt (server/bench/data/chat_prompts.json) is sent alone as one user message, at
temperature 0 with a max_tokens cap, to a running gateway or to one started per chat format
(POLYHEAD_CHAT_FORMAT). The target check is what a base model without a turn format gets
wrong: a reply that writes a role marker (a line opening with `user:`, `assistant:`, ...,
or a turn token's text) or repeats the user's prompt verbatim has run past its own turn.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from importlib.resources import files
from pathlib import Path

import httpx

PROMPTS = "chat_prompts.json"
# A line that opens a turn in the plain or the question/answer format, or a turn token.
ROLE_MARKER = re.compile(r"(?im)^\s*(user|assistant|system|model|question|answer)\s*:"
                         r"|<start_of_turn>|<end_of_turn>|<\|im_(start|end)\|>")


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    id: str
    lang: str
    text: str


@dataclass(frozen=True, slots=True)
class Answer:
    prompt_id: str
    lang: str
    head: str
    finish_reason: str
    completion_tokens: int
    text: str
    problems: tuple[str, ...]  # empty: the reply passes the target check


def load_prompts(path: Path | None = None) -> list[ChatPrompt]:
    raw = (path.read_text() if path is not None
           else files("server.bench").joinpath("data", PROMPTS).read_text())
    return [ChatPrompt(p["id"], p["lang"], p["text"]) for p in json.loads(raw)["prompts"]]


def problems(prompt: str, reply: str) -> tuple[str, ...]:
    out = []
    if (m := ROLE_MARKER.search(reply)) is not None:
        out.append(f"role marker {m.group().strip()!r}")
    if prompt.strip() and prompt.strip() in reply:
        out.append("repeats the prompt")
    return tuple(out)


def ask(client: httpx.Client, url: str, model: str, prompt: ChatPrompt,
        max_tokens: int) -> Answer:
    body = {"model": model, "messages": [{"role": "user", "content": prompt.text}],
            "temperature": 0, "max_tokens": max_tokens, "seed": 0}
    r = client.post(f"{url}/v1/chat/completions", json=body)
    r.raise_for_status()
    choice = r.json()["choices"][0]
    text = choice["message"]["content"] or ""
    return Answer(prompt.id, prompt.lang, r.headers.get("x-polyhead-head", "?"),
                  choice["finish_reason"], r.json()["usage"]["completion_tokens"], text,
                  problems(prompt.text, text))


def run_prompts(url: str, prompts: list[ChatPrompt], max_tokens: int) -> list[Answer]:
    with httpx.Client(timeout=600) as client:
        model = client.get(f"{url}/v1/models").json()["data"][0]["id"]
        return [ask(client, url, model, p, max_tokens) for p in prompts]


def table(label: str, answers: list[Answer]) -> str:
    lines = [f"--- {label}",
             f"{'prompt':12} {'head':5} {'finish':6} {'toks':>4}  reply (first 110 chars)"]
    for a in answers:
        mark = "" if not a.problems else f"   <- {'; '.join(a.problems)}"
        lines.append(f"{a.prompt_id:12} {a.head:5} {a.finish_reason:6} "
                     f"{a.completion_tokens:4d}  {a.text[:110]!r}{mark}")
    return "\n".join(lines)


def target(label: str, answers: list[Answer]) -> str:
    bad = [a for a in answers if a.problems]
    stopped = sum(a.finish_reason == "stop" for a in answers)
    verdict = "MET" if not bad else "MISSED"
    return (f"target [{label}] no reply repeats a role marker or the user's prompt verbatim: "
            f"{len(answers) - len(bad)}/{len(answers)} clean, {stopped} ended by 'stop': "
            f"{verdict}")


def write(runs: dict[str, list[Answer]], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "bench_chat.json"
    path.write_text(json.dumps({k: [asdict(a) for a in v] for k, v in runs.items()},
                               indent=2, ensure_ascii=False) + "\n")
    return path

"""The documented requests against `polyhead serve` from a venv holding exactly what
`make serve` installs (`make install VENV=.venv-readme`: `pip install -e .`, no extras, not the
test venv): every curl line of the README's quick start and of the pages that show requests
(readme_util.RUNNABLE), parsed from the pages and run with curl as written; the quick start's
Python blocks, run with this venv's `openai` client (the client is the user's, the server the
default install's); then one request per feature docs/api.md lists, each status and body shape
checked.

A documented example the server refuses, or a listed feature that needs a package only the
test extras bring (xgrammar once did), fails here. The server runs the tiny model under an
empty HOME, as a first run does; the pages' demo names map onto it (readme_util.DEMO_TO_TINY).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Gateway, start_gateway, stop_gateway
from tests.server.readme_checks import (
    HEADS,
    SCHEMA,
    Example,
    all_of,
    chat,
    chat_logprobs,
    comp,
    completion_logprobs,
    echoes,
    has_keys,
    is_error,
    is_schema_json,
    is_scored,
    is_sse,
    json_if_finished,
    lists_models,
    matches,
    names_ignored,
    no_turn_markers,
    on_head,
    one_of,
    prompt_logprobs,
    response_text,
    text_of,
    usage_is,
)
from tests.server.readme_util import (
    aim,
    data_of,
    make_install,
    method_and_path,
    on_server,
    python_blocks,
    quick_start,
    run_curl,
    runnable_commands,
)

# The first test builds the venv when it is missing: 100 s from none, server start included,
# on 2 cores with a warm pip cache (pytest --durations); a rerun finds it built.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1200)]

STATUSES: Counter[int] = Counter()  # every answer the tier got, by status


@pytest.fixture(scope="module")
def readme_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, dict]]:
    venv = make_install()
    exports, _ = runnable_commands()
    home = tmp_path_factory.mktemp("empty-home")
    log = tmp_path_factory.mktemp("readme") / "gateway.log"
    gw = start_gateway("tiny", log, 300, command=[str(venv / "bin" / "polyhead"), "serve"],
                       HOME=str(home), PYTHONPATH="", **exports)
    yield gw, exports
    assert stop_gateway(gw) == 0


def test_the_venv_holds_only_the_default_install(readme_server) -> None:
    py = str(make_install() / "bin" / "python")
    extras = "import importlib.util as u; print([m for m in ('openai', 'pytest', 'vllm') " \
             "if u.find_spec(m)])"
    assert subprocess.run([py, "-c", extras], capture_output=True, text=True,
                          check=True).stdout.strip() == "[]"


def test_every_documented_curl_line_runs(readme_server, tmp_path: Path) -> None:
    gw, exports = readme_server
    _, curls = runnable_commands()
    assert len(curls) >= 5  # the quick start's chat, pinned completion and policy switches
    before = httpx.get(f"{gw.url}/admin/policy", headers=_auth(exports)).json()
    try:
        for words in curls:
            cmd = on_server(words, gw.url, exports)
            answer = run_curl(cmd, tmp_path, exports)
            STATUSES[answer.status] += 1
            assert 200 <= answer.status < 300, (
                f"documented example refused: {' '.join(words)}\n-> {answer.status} {answer.body}")
            _check_readme_answer(cmd, answer)
    finally:
        now = httpx.get(f"{gw.url}/admin/policy", headers=_auth(exports)).json()
        if now["version"] != before["version"]:  # the pages switch the policy: switch back
            httpx.put(f"{gw.url}/admin/policy", headers=_auth(exports), timeout=30,
                      json={"name": before["name"], "params": before["params"]})


def test_the_quick_starts_python_runs(readme_server, tmp_path: Path) -> None:
    gw, exports = readme_server
    blocks = python_blocks(quick_start())
    assert blocks and all("from openai import OpenAI" in b for b in blocks)
    for i, block in enumerate(blocks):
        script = tmp_path / f"quick_start_{i}.py"
        script.write_text(aim(block, gw.url))
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              timeout=120, cwd=tmp_path, env={**os.environ, **exports})
        assert done.returncode == 0, f"quick start's Python failed:\n{block}\n{done.stderr}"
        # The block prints the head that served it first (the x-polyhead-head header).
        assert done.stdout.split()[0] in HEADS, done.stdout


def _check_readme_answer(cmd: list[str], answer: Any) -> None:
    method, path = method_and_path(cmd)
    if "text/event-stream" in answer.headers.get("content-type", ""):
        events = answer.sse()
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert chunks and all(c["object"] == "chat.completion.chunk" for c in chunks)
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    else:
        body = answer.json()
        assert isinstance(body, dict) and "error" not in body
    if path.endswith("/completions"):
        assert answer.headers["x-polyhead-head"] in HEADS
        assert answer.headers["x-polyhead-policy"] and answer.headers["x-request-id"]
    if path == "/admin/policy":
        assert {"name", "params", "version"} <= set(answer.json())
        if method == "PUT":
            assert answer.json()["name"] == data_of(cmd)["name"]


# One request per feature docs/api.md lists (and the admin routes docs/operations.md lists).
EXAMPLES = [
    # The basics: routed and pinned, the sampling fields, streaming, ignored and unknown fields.
    Example("models", "/v1/models", check=lists_models),
    Example("model", "/v1/models/tiny:4k", check=has_keys("id", "max_model_len", "polyhead")),
    Example("chat routed", "/v1/chat/completions", chat(),
            check=all_of(has_keys("choices", "usage"), no_turn_markers)),
    Example("chat pinned", "/v1/chat/completions", chat(model="tiny:1k"), check=on_head("1k")),
    Example("completion sampling", "/v1/completions",
            comp(n=2, seed=7, temperature=0.8, top_p=0.9, top_k=20, stop=["\n"]),
            check=has_keys("choices", "usage")),
    Example("completion stream", "/v1/completions",
            comp(stream=True, stream_options={"include_usage": True}), check=is_sse()),
    Example("chat stream", "/v1/chat/completions", chat(stream=True), check=is_sse()),
    Example("ignored fields", "/v1/chat/completions",
            chat(user="u", metadata={"k": "v"}, store=False, service_tier="auto",
                 parallel_tool_calls=False, reasoning_effort="low", modalities=["text"],
                 prompt_cache_key="p", safety_identifier="s"), check=names_ignored),
    Example("unknown field", "/v1/completions", comp(tempreature=1), 400,
            is_error("tempreature")),
    # Logprobs.
    Example("completion logprobs", "/v1/completions", comp(logprobs=2),
            check=completion_logprobs),
    Example("chat logprobs", "/v1/chat/completions", chat(logprobs=True, top_logprobs=2),
            check=chat_logprobs),
    Example("echo logprobs", "/v1/completions", comp(echo=True, logprobs=1, max_tokens=2),
            check=echoes("Hello")),
    Example("echo scoring (max_tokens 0)", "/v1/completions",
            comp(echo=True, logprobs=0, max_tokens=0), check=is_scored),
    Example("prompt_logprobs", "/v1/completions", comp(prompt_logprobs=2),
            check=prompt_logprobs),
    # vLLM's sampling extensions.
    Example("ignore_eos min_tokens", "/v1/completions",
            comp(ignore_eos=True, min_tokens=4, max_tokens=4),
            check=usage_is("completion_tokens", 4)),
    Example("stop_token_ids include_stop_str", "/v1/completions",
            comp(stop_token_ids=[5], stop=[" "], include_stop_str_in_output=True)),
    Example("special tokens", "/v1/completions",
            comp(skip_special_tokens=False, spaces_between_special_tokens=False)),
    Example("truncate_prompt_tokens", "/v1/completions",
            comp("one two three four five six", model="tiny:1k", truncate_prompt_tokens=3),
            check=usage_is("prompt_tokens", 3)),
    Example("add_special_tokens", "/v1/completions", comp(add_special_tokens=False)),
    Example("penalties min_p", "/v1/completions",
            comp(repetition_penalty=1.2, presence_penalty=0.5, frequency_penalty=0.5,
                 min_p=0.1)),
    Example("logit_bias allowed_token_ids", "/v1/completions",
            comp(model="tiny:1k", logit_bias={"5": 100}, allowed_token_ids=[5, 6])),
    Example("bad_words", "/v1/completions", comp(bad_words=["the"])),
    Example("chat continue_final_message echo", "/v1/chat/completions",
            {**chat(), "messages": [{"role": "user", "content": "Hi"},
                                    {"role": "assistant", "content": "Well"}],
             "add_generation_prompt": False, "continue_final_message": True, "echo": True,
             "chat_template_kwargs": {}},
            check=lambda r: None if text_of(r).startswith("Well") else pytest.fail(text_of(r))),
    Example("min_tokens keeps turn stops", "/v1/chat/completions",
            chat(min_tokens=6, temperature=0), check=no_turn_markers),
    Example("suffix", "/v1/completions", comp(suffix="x"), 400, is_error("suffix")),
    Example("best_of", "/v1/completions", comp(best_of=2), 400, is_error("best_of")),
    Example("tools", "/v1/chat/completions",
            chat(tools=[{"type": "function", "function": {"name": "f"}}]), 400,
            is_error("tools")),
    # Structured output (xgrammar, a default-install dependency).
    Example("response_format json_schema chat", "/v1/chat/completions",
            chat(max_tokens=32, response_format={
                "type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}}),
            check=is_schema_json),
    Example("response_format json_object completion", "/v1/completions",
            comp(max_tokens=32, response_format={"type": "json_object"}),
            check=json_if_finished),
    Example("response_format json_object chat stream", "/v1/chat/completions",
            chat(max_tokens=16, stream=True, response_format={"type": "json_object"}),
            check=is_sse()),
    Example("structured_outputs json", "/v1/completions",
            comp(max_tokens=32, structured_outputs={"json": SCHEMA}), check=is_schema_json),
    Example("structured_outputs regex", "/v1/completions",
            comp(structured_outputs={"regex": "[0-9]{3}"}), check=matches("[0-9]{3}")),
    Example("structured_outputs choice", "/v1/completions",
            comp(structured_outputs={"choice": ["red", "blue"]}), check=one_of("red", "blue")),
    Example("structured_outputs grammar", "/v1/completions",
            comp(structured_outputs={"grammar": 'root ::= "yes" | "no"'}),
            check=one_of("yes", "no")),
    Example("structured_outputs json_object", "/v1/completions",
            comp(max_tokens=32, structured_outputs={"json_object": True}),
            check=json_if_finished),
    Example("guided_json", "/v1/chat/completions", chat(max_tokens=32, guided_json=SCHEMA),
            check=is_schema_json),
    Example("guided_regex", "/v1/chat/completions", chat(guided_regex="[a-c]{2}"),
            check=matches("[a-c]{2}")),
    Example("guided_choice", "/v1/chat/completions", chat(guided_choice=["yes", "no"]),
            check=one_of("yes", "no")),
    Example("guided_grammar", "/v1/completions", comp(guided_grammar='root ::= "a" | "b"'),
            check=one_of("a", "b")),
    Example("bad schema", "/v1/chat/completions",
            chat(response_format={"type": "json_schema",
                                  "json_schema": {"name": "x", "schema": {"type": "bogus"}}}),
            400, is_error("response_format")),
    # Per-head routes, and token-id prompts on a pinned head.
    Example("head completions", "/heads/4k/v1/completions", comp(), check=on_head("4k")),
    Example("head chat", "/heads/4k/v1/chat/completions", chat(), check=on_head("4k")),
    Example("head responses", "/heads/4k/v1/responses",
            {"model": "tiny", "input": "Hi", "max_output_tokens": 8}, check=response_text),
    Example("head tokenize", "/heads/4k/tokenize", {"prompt": "Hello"},
            check=all_of(has_keys("count", "max_model_len", "tokens"), on_head("4k"))),
    Example("head detokenize", "/heads/4k/detokenize", {"tokens": [77, 106]},
            check=has_keys("prompt", "head")),
    Example("head tokenizer_info", "/heads/4k/tokenizer_info",
            check=all_of(has_keys("vocab_size", "model_max_length"), on_head("4k"))),
    Example("head pinned elsewhere", "/heads/4k/v1/completions", comp(model="tiny:1k"), 400,
            is_error()),
    Example("tokenizer_info", "/tokenizer_info", check=on_head("8k")),
    Example("tokenizer_info pinned", "/tokenizer_info?model=tiny:1k", check=on_head("1k")),
    Example("token ids pinned", "/v1/completions", comp([1, 2, 3], model="tiny:1k"),
            check=usage_is("prompt_tokens", 3)),
    Example("token ids unpinned", "/v1/completions", comp([1, 2, 3]), 400, is_error("prompt")),
    Example("token id past the head", "/v1/completions", comp([5000], model="tiny:1k"), 400,
            is_error("prompt")),
    # The Responses API.
    Example("responses", "/v1/responses",
            {"model": "tiny", "input": "Hi", "instructions": "Be brief.",
             "max_output_tokens": 8}, check=response_text),
    Example("responses messages", "/v1/responses",
            {"model": "tiny", "input": [{"role": "user", "content": "Hi"}],
             "max_output_tokens": 8}, check=response_text),
    Example("responses stream", "/v1/responses",
            {"model": "tiny", "input": "Hi", "max_output_tokens": 8, "stream": True},
            check=is_sse("response.completed", "response.incomplete")),
    Example("responses tools", "/v1/responses",
            {"model": "tiny", "input": "Hi", "tools": [{"type": "function", "name": "f"}]},
            400, is_error()),
    Example("responses previous_response_id", "/v1/responses",
            {"model": "tiny", "input": "Hi", "previous_response_id": "resp_1"}, 400, is_error()),
    # Tokenizer endpoints.
    Example("tokenize", "/tokenize", {"model": "tiny", "prompt": "Hello"},
            check=has_keys("count", "max_model_len", "tokens", "head")),
    Example("tokenize chat", "/tokenize",
            {"model": "tiny:1k", "messages": [{"role": "user", "content": "Hi"}]},
            check=has_keys("count", "tokens")),
    Example("tokenize bos", "/tokenize",
            {"model": "tiny:1k", "prompt": "<|bos|>", "add_special_tokens": False},
            check=lambda r: None if r.json()["tokens"] == [0] else pytest.fail(r.text)),
    Example("detokenize", "/detokenize", {"model": "tiny:1k", "tokens": [77, 106]},
            check=has_keys("prompt")),
    Example("detokenize unpinned", "/detokenize", {"model": "tiny", "tokens": [1]}, 400,
            is_error("model")),
    # Health, metrics and the admin API.
    Example("healthz", "/healthz", check=has_keys("status")),
    Example("readyz", "/readyz",
            check=lambda r: None if r.json()["structured_output"] in ("ready", "warming")
            else pytest.fail(r.text)),
    Example("metrics", "/metrics",
            check=lambda r: None if "polyhead_" in r.text else pytest.fail(r.text[:200])),
    Example("admin policy", "/admin/policy", admin=True, check=has_keys("name", "version")),
    Example("admin policy dry_run", "/admin/policy?dry_run=true", {"name": "cost"},
            admin=True),
    Example("admin policy stale If-Match", "/admin/policy", {"name": "cost"}, 409, is_error(),
            headers={"if-match": "999"}, admin=True),
    Example("admin decisions", "/admin/decisions?limit=2", admin=True, check=has_keys("decisions")),
    Example("admin lambda", "/admin/lambda", admin=True, check=has_keys("measured", "effective")),
    Example("admin heads", "/admin/heads", admin=True, check=has_keys("heads")),
    Example("admin drain", "/admin/heads/8k/drain", {}, admin=True, check=has_keys("state")),
    Example("admin undrain", "/admin/heads/8k/undrain", {}, admin=True, check=has_keys("state")),
    Example("admin state", "/admin/state", admin=True),
    Example("admin admission", "/admin/admission", admin=True),
    Example("admin audit", "/admin/audit", admin=True, check=has_keys("records")),
    Example("admin plan", "/admin/plan", admin=True,
            check=has_keys("optimal_head", "quality_bound", "units", "candidates")),
    Example("admin bad token", "/admin/policy", status=401, check=is_error(),
            headers={"authorization": "Bearer wrong"}),
    # The errors docs/api.md lists, and a value past the one limit.
    Example("bad value", "/v1/completions", comp(temperature=9), 400, is_error("temperature")),
    Example("past max_model_len", "/v1/completions", comp(max_tokens=10_000_000), 400,
            is_error("max_tokens")),
    Example("unknown model", "/v1/completions", comp(model="gpt-4"), 404, is_error("model")),
    Example("unknown head", "/v1/completions", comp(model="tiny:99k"), 404, is_error("model")),
    Example("body too large", "/v1/completions", comp("x" * (1 << 20)), 413, is_error()),
]


def _auth(exports: dict) -> dict:
    return {"authorization": f"Bearer {exports['POLYHEAD_ADMIN_TOKEN']}"}


@pytest.mark.parametrize("ex", EXAMPLES, ids=[e.name for e in EXAMPLES])
def test_feature(readme_server, ex: Example) -> None:
    gw, exports = readme_server
    headers = {**(_auth(exports) if ex.admin else {}), **ex.headers}
    url = f"{gw.url}{ex.path}"
    r = (httpx.get(url, headers=headers, timeout=60) if ex.body is None
         else httpx.request("PUT" if ex.path.startswith("/admin/policy") else "POST", url,
                            json=ex.body, headers=headers, timeout=60))
    STATUSES[r.status_code] += 1
    assert r.status_code == ex.status, r.text[:1000]
    if ex.check is not None:
        ex.check(r)


def test_malformed_json_and_a_lone_surrogate_are_400(readme_server) -> None:
    gw, _ = readme_server
    for raw in (b'{"model": "tiny", "prompt": ', b'{"model": "tiny", "prompt": "\\ud800"}'):
        r = httpx.post(f"{gw.url}/v1/completions", content=raw, timeout=30,
                       headers={"content-type": "application/json"})
        STATUSES[r.status_code] += 1
        assert r.status_code == 400, r.text


def test_no_500_and_no_traceback(readme_server) -> None:
    gw, _ = readme_server
    assert sum(STATUSES.values()) >= len(EXAMPLES)
    assert not [s for s in STATUSES if s >= 500], STATUSES
    assert "Traceback" not in gw.log()

"""A chat reply ends at the next turn's marker, which it never contains, with finish_reason
"stop": through the real server and the official client, streaming and not, n = 2.

The echo backend replays the rendered prompt's ids, so its reply is the conversation as the
chat format laid it out: the system text, then the first user turn's marker, where the
implicit stop cuts it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.conftest import Gateway, start_gateway, stop_gateway

pytestmark = pytest.mark.integration
MESSAGES = [{"role": "system", "content": "Sea"}, {"role": "user", "content": "hi there"}]
# format -> the reply the echo gives: what precedes the first user turn's marker
EXPECTED = {"qa": "Sea\n", "plain": "system: Sea"}


@pytest.fixture(scope="module", params=sorted(EXPECTED))
def served(request: pytest.FixtureRequest, tiny_model_dir: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Gateway]]:
    logs = tmp_path_factory.mktemp(f"turns-{request.param}")
    gw = start_gateway(tiny_model_dir, logs / "gw.log", POLYHEAD_BACKEND="echo",
                       POLYHEAD_CHAT_FORMAT=request.param, POLYHEAD_CACHE_DIR=str(logs))
    yield request.param, gw
    stop_gateway(gw)


def _client(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key="x", max_retries=0, timeout=60)


def test_reply_stops_before_the_next_turn(served):
    fmt, gw = served
    r = _client(gw).chat.completions.create(model="tiny", messages=MESSAGES, n=2,
                                            max_tokens=64, temperature=0)
    assert [c.message.content for c in r.choices] == [EXPECTED[fmt]] * 2
    assert [c.finish_reason for c in r.choices] == ["stop", "stop"]
    assert r.usage is not None and r.usage.completion_tokens < 2 * 64


def test_streamed_reply_stops_before_the_next_turn(served):
    fmt, gw = served
    stream = _client(gw).chat.completions.create(model="tiny", messages=MESSAGES, n=2,
                                                 max_tokens=64, temperature=0, stream=True)
    text, finish = ["", ""], [None, None]
    for chunk in stream:
        for c in chunk.choices:
            text[c.index] += c.delta.content or ""
            finish[c.index] = c.finish_reason or finish[c.index]
    assert text == [EXPECTED[fmt]] * 2 and finish == ["stop", "stop"]


def test_completions_get_no_implicit_stop(served):
    _, gw = served
    r = _client(gw).completions.create(model="tiny", prompt="a\nuser: b\nQuestion: c",
                                       max_tokens=16, temperature=0)
    assert r.choices[0].finish_reason == "length"
    assert "\nuser:" in r.choices[0].text and "\nQuestion:" in r.choices[0].text


def test_turn_markers_end_the_reply_even_under_min_tokens(served):
    """min_tokens holds back the client's stop strings (vLLM's rule), never the layout's own
    next-turn markers: a reply under min_tokens 48 still ends before the next turn."""
    fmt, gw = served
    r = _client(gw).chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=64, temperature=0,
        extra_body={"min_tokens": 48, "include_stop_str_in_output": True})
    assert r.choices[0].message.content == EXPECTED[fmt]
    assert r.choices[0].finish_reason == "stop"

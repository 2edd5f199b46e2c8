"""Property-based fuzz of the live gateway: no input yields a 5xx or a logged traceback.

Two generators against one real `polyhead serve` process on the tiny model:
- schemathesis, from the gateway's own OpenAPI spec, over the OpenAI routes and the admin
  API (schema-valid and schema-violating cases);
- hypothesis strategies for what a JSON schema cannot express: lone surrogates, NaN and
  Infinity, huge integers, deep nesting, 10k-entry stop lists, out-of-range token ids,
  arbitrary content parts and unknown field names.
Every answer must be below 500 and, when an error, an OpenAI error body. The last test reads
the gateway's log: no traceback may appear in it.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.bootstrap import create_app
from server.settings import Settings
from tests.conftest import ADMIN_TOKEN, Gateway, start_gateway, stop_gateway

pytestmark = [pytest.mark.integration, pytest.mark.slow]

log = logging.getLogger(__name__)
AUTH = {"authorization": f"Bearer {ADMIN_TOKEN}"}
HEADS = ("1k", "4k", "8k")
FUZZ_SETTINGS = settings(deadline=None, suppress_health_check=list(HealthCheck),
                         derandomize=True, database=None)
RESULTS: Counter[str] = Counter()  # "<generator> <status class>" -> cases


@pytest.fixture(scope="module")
def fuzz_gateway(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[Gateway]:
    # Small output limits keep every generated request cheap on one CPU thread: a context of
    # 40 tokens caps a prompt's max_tokens at what it leaves (the 8 of the old output cap
    # after a 32-token prompt).
    gw = start_gateway(tiny_model_dir, tmp_path_factory.mktemp("fuzz") / "gateway.log",
                       POLYHEAD_ADMIN_TOKEN=ADMIN_TOKEN, POLYHEAD_MAX_BODY_BYTES=str(256 * 1024),
                       POLYHEAD_MAX_MODEL_LEN="40", POLYHEAD_DEFAULT_MAX_TOKENS="2",
                       POLYHEAD_CACHE_DIR=str(tmp_path_factory.mktemp("fuzz-cache")))
    yield gw
    stop_gateway(gw)
    sys.stdout.write(f"\nfuzz cases by generator and status: {dict(sorted(RESULTS.items()))}\n")


def _spec() -> dict:
    """The OpenAPI document the app serves (the live one is compared to it below); built
    at import so schemathesis can parametrize one test per operation."""
    with tempfile.TemporaryDirectory() as cache:
        return create_app(Settings(cache_dir=Path(cache))).openapi()


SPEC = _spec()
schema = schemathesis.openapi.from_dict(SPEC)


def test_fuzzed_spec_is_the_live_one(fuzz_gateway: Gateway) -> None:
    assert httpx.get(f"{fuzz_gateway.url}/openapi.json", timeout=30).json() == SPEC


def check_answer(r: httpx.Response | object, generator: str) -> None:
    status = int(r.status_code)  # type: ignore[attr-defined]
    RESULTS[f"{generator} {status // 100}xx"] += 1
    assert status < 500, f"{status}: {r.text[:500]}"  # type: ignore[attr-defined]
    if status >= 400:
        err = r.json()["error"]  # type: ignore[attr-defined]
        assert set(err) == {"message", "type", "param", "code"} and err["message"]


def _restore(gw: Gateway) -> None:
    """Undo what an admin case changed that would turn later cases into 503s by design."""
    for h in HEADS:
        httpx.post(f"{gw.url}/admin/heads/{h}/undrain", headers=AUTH, timeout=30)


@schema.parametrize()
@settings(FUZZ_SETTINGS, max_examples=30)
def test_schemathesis_no_server_errors(case, fuzz_gateway: Gateway) -> None:
    r = case.call(base_url=fuzz_gateway.url, headers=AUTH, timeout=60)
    check_answer(r, "schemathesis")
    if case.path.startswith("/admin") and case.method.upper() != "GET":
        _restore(fuzz_gateway)


# --- hostile values a JSON schema cannot describe -------------------------------------------

# Every code point; and text with a lone surrogate for sure (json.dumps writes it as a \udxxx
# escape): drawn uniformly, surrogates are 2 in 1000 characters and often come paired.
lone_surrogate = st.tuples(st.text(max_size=8), st.characters(categories=["Cs"]),
                           st.text(max_size=8)).map(lambda t: f"{t[0]}{t[1]}x{t[2]}")
any_text = st.text(st.characters(exclude_categories=()), max_size=40) | lone_surrogate
# The JSON float literals Python's parser accepts beyond the standard: NaN, Infinity.
odd_floats = st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -0.0, 5e-324])
huge_ints = st.integers(min_value=-(10**300), max_value=10**300) | st.sampled_from(
    [2**63, 2**64, -(2**63) - 1, 2**31, -1])
scalars = st.none() | st.booleans() | huge_ints | odd_floats | st.floats() | any_text
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(any_text, inner, max_size=4), max_leaves=12)
content_parts = st.lists(st.dictionaries(
    st.sampled_from(["type", "text", "image_url", "input_audio", "file"]) | any_text,
    json_values, max_size=3), max_size=3)
token_prompts = st.lists(huge_ints | st.integers(-5, 9000), min_size=0, max_size=6) | st.lists(
    st.lists(st.integers(-5, 9000), max_size=4), max_size=3)
huge_stop_lists = st.integers(4, 10_000).map(lambda n: ["x"] * n)

COMPLETION = {"model": "tiny", "prompt": "hello", "max_tokens": 2}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
RESPONSES = {"model": "tiny", "input": "hi", "max_output_tokens": 2}
BASES = {"/v1/completions": COMPLETION, "/v1/chat/completions": CHAT, "/v1/responses": RESPONSES}
COMMON = ("model", "max_tokens", "temperature", "top_p", "top_k", "n", "stop", "seed",
          "stream", "stream_options", "logprobs", "user", "metadata", "store", "service_tier",
          "parallel_tool_calls", "modalities", "prompt_bpb")
FIELDS = {"/v1/completions": (*COMMON, "prompt", "echo", "best_of", "suffix"),
          "/v1/chat/completions": (*COMMON, "messages", "max_completion_tokens",
                                   "response_format", "tools", "top_logprobs"),
          "/v1/responses": ("model", "input", "instructions", "max_output_tokens",
                            "temperature", "top_p", "stream", "previous_response_id", "tools",
                            "text", "truncation", "metadata", "store")}
UNKNOWN = "<unknown field>"


def hostile_value(field: str) -> st.SearchStrategy:
    special = {"prompt": token_prompts | any_text, "stop": huge_stop_lists | json_values,
               "messages": st.lists(st.fixed_dictionaries(
                   {"role": st.sampled_from(["user", "system", "assistant", "bogus"]),
                    "content": content_parts | any_text | json_values}), max_size=3),
               "input": st.lists(st.fixed_dictionaries(
                   {"role": st.sampled_from(["user", "developer", "bogus"]),
                    "content": content_parts | any_text | json_values}), max_size=3)
               | content_parts | any_text,
               "model": st.sampled_from(["tiny", "tiny:1k", "tiny:8k", "tiny:", ":"]) | any_text}
    return special.get(field, st.nothing()) | json_values


@st.composite
def hostile_bodies(draw: st.DrawFn, path: str, field: str) -> tuple[str, str, bytes]:
    """A valid body for `path` with `field` set to a hostile value, maybe one more too."""
    body = dict(BASES[path])
    name = draw(any_text) if field == UNKNOWN else field
    body[name] = draw(hostile_value(name))
    if draw(st.booleans()):
        other = draw(st.sampled_from(FIELDS[path]))
        body[other] = draw(hostile_value(other))
    raw = json.dumps(body, allow_nan=True)  # ensure_ascii: lone surrogates as escapes
    return "POST", path, raw.encode()


@st.composite
def hostile_admin(draw: st.DrawFn) -> tuple[str, str, bytes]:
    kind = draw(st.sampled_from(["policy", "lambda", "drain", "decisions"]))
    if kind == "policy":
        body = {"name": draw(st.sampled_from(["cost", "fixed", "min_bpt"]) | any_text),
                "params": draw(st.dictionaries(any_text, json_values, max_size=3))}
        return "PUT", "/admin/policy?dry_run=true", json.dumps(body, allow_nan=True).encode()
    if kind == "lambda":
        body = {"forecast": draw(odd_floats | huge_ints | json_values)}
        return "PUT", "/admin/lambda", json.dumps(body, allow_nan=True).encode()
    if kind == "drain":
        head = draw(st.sampled_from(HEADS) | any_text.map(
            lambda s: quote(s, safe="", errors="surrogatepass") or "x"))
        return "POST", f"/admin/heads/{head}/drain", b""
    limit = draw(huge_ints)
    return "GET", f"/admin/decisions?limit={limit}", b""


def nested(depth: int, opener: str, inner: str, closer: str) -> bytes:
    value = opener * depth + inner + closer * depth
    return f'{{"model": "tiny", "prompt": "x", "metadata": {value}}}'.encode()


RAW_BODIES = [
    b'{"model": "tiny", "prompt": "\\u0000\\ud800 x"}',  # the reported lone surrogate
    b'{"model": "tiny", "prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}",  # > int limit
    b'{"model": "tiny", "prompt": "x", "temperature": NaN}',
    b'{"model": "tiny", "prompt": "x", "top_p": Infinity}',
    b'{"model": "tiny", "prompt": "\xff\xfe"}',  # not UTF-8
    nested(5000, "[", "", "]"), nested(2000, '{"a":', "1", "}"),
    b"[]", b"null", b"", b'"x"', b'{"model": "tiny", "prompt": "x"',
]


def send(gw: Gateway, method: str, path: str, body: bytes) -> httpx.Response:
    return httpx.request(method, f"{gw.url}{path}", content=body, timeout=60,
                         headers={**AUTH, "content-type": "application/json"})


@pytest.mark.parametrize("body", RAW_BODIES, ids=range(len(RAW_BODIES)))
def test_raw_hostile_bodies_are_4xx(fuzz_gateway: Gateway, body: bytes) -> None:
    for path in (*BASES, "/tokenize", "/admin/policy"):
        r = send(fuzz_gateway, "PUT" if path == "/admin/policy" else "POST", path, body)
        check_answer(r, "raw")
        assert r.status_code in (400, 413), r.text


@pytest.mark.parametrize(("path", "field"), [
    (path, f) for path, fields in FIELDS.items() for f in (*fields, UNKNOWN)])
@settings(FUZZ_SETTINGS, max_examples=10)
@given(data=st.data())
def test_hypothesis_openai_bodies(fuzz_gateway: Gateway, path: str, field: str,
                                  data: st.DataObject) -> None:
    check_answer(send(fuzz_gateway, *data.draw(hostile_bodies(path, field))), "hypothesis")


@settings(FUZZ_SETTINGS, max_examples=150)
@given(req=hostile_admin())
def test_hypothesis_admin_bodies(fuzz_gateway: Gateway, req: tuple[str, str, bytes]) -> None:
    check_answer(send(fuzz_gateway, *req), "hypothesis-admin")
    if "/drain" in req[1]:
        _restore(fuzz_gateway)


def test_lone_surrogate_is_400_naming_the_field(fuzz_gateway: Gateway) -> None:
    r = send(fuzz_gateway, "POST", "/v1/chat/completions",
             b'{"model": "tiny", "messages": [{"role": "user", "content": "a\\udc00"}]}')
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "messages.0.content"


def test_no_traceback_was_logged(fuzz_gateway: Gateway) -> None:
    """Runs last in this module: every case above has been answered."""
    text = fuzz_gateway.log()
    assert "Traceback" not in text, text[text.find("Traceback") - 2000:][:6000]
    assert sum(RESULTS.values()) > 1000
    assert not any(k.endswith("5xx") for k in RESULTS)

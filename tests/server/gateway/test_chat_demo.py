"""Chat on the Gemma-3 demo (a base model without a chat template): its turn tokens are one
special token on every nested head, and a greedy reply through the real server ends its own
turn, writing no role marker."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from heads.checkpoint import load_metadata
from kernels.cache_paths import cache_root
from server.bench.chat import ROLE_MARKER
from server.gateway.chat_template import (
    GEMMA,
    GEMMA_TEMPLATE,
    choose_chat_format,
    render_chat,
    special_on_every_head,
)
from server.model_source import resolve_model_dir
from tests.conftest import Gateway, start_gateway, stop_gateway

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def demo():
    return resolve_model_dir("gemma3-270m", cache_root(expand_user=True))


def test_turn_tokens_are_single_specials_on_every_head(demo):
    manifest, tokenizers = load_metadata(demo)
    assert {h.vocab_size for h in manifest.heads} == {32768, 131072, 262144}
    assert manifest.chat_template is None  # the base GGUF carries none
    for text in ("<start_of_turn>", "<end_of_turn>", "<eos>"):
        assert special_on_every_head(tokenizers, text), text
    fmt = choose_chat_format(None, manifest.backbone.architecture,
                             lambda t: special_on_every_head(tokenizers, t), "gemma")
    assert fmt is GEMMA
    prompt = render_chat([{"role": "user", "content": "Hi"}], GEMMA_TEMPLATE, "<bos>", "<eos>")
    for name, tok in tokenizers.items():
        ids = tok.encode_with_specials(prompt)
        start, end = tok.token_to_id("<start_of_turn>"), tok.token_to_id("<end_of_turn>")
        assert ids.count(start) == 2 and ids.count(end) == 1, name  # user turn, model turn


@pytest.fixture(scope="module")
def gateway(demo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    logs = tmp_path_factory.mktemp("chat-demo")
    gw = start_gateway(demo, logs / "gw.log", POLYHEAD_TORCH_THREADS="2",
                       POLYHEAD_KV_CACHE_MB="64", POLYHEAD_CACHE_DIR=str(logs))
    yield gw
    stop_gateway(gw)


@pytest.mark.integration
def test_hello_and_a_question_end_their_turn(gateway):
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0,
                           timeout=300)

    def ask(text: str) -> tuple[str, str]:
        r = client.chat.completions.create(model="gemma3-270m", max_tokens=48, temperature=0,
                                           messages=[{"role": "user", "content": text}])
        return r.choices[0].message.content or "", r.choices[0].finish_reason

    hello, _ = ask("Hello")
    assert hello.strip() and ROLE_MARKER.search(hello) is None, hello
    # The base model rambles on after "Hello" (48 tokens, "length"); a question it can
    # answer shows the turn ending, by the implicit "\nQuestion:" stop or EOS.
    paris, finish = ask("What is the capital of France?")
    assert finish == "stop" and "Paris" in paris and ROLE_MARKER.search(paris) is None, paris

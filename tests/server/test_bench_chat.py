"""polyhead bench chat: the committed prompts, the target check, and a quick smoke run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from server.bench.chat import load_prompts, problems


def test_the_committed_set_has_20_distinct_prompts_in_many_languages():
    prompts = load_prompts()
    assert len(prompts) == 20 and len({p.id for p in prompts}) == 20
    assert {"en", "de", "ru", "ja", "hi", "ko", "code"} <= {p.lang for p in prompts}


@pytest.mark.parametrize(("reply", "found"), [
    (" Paris.", ()),
    (" Paris.\nuser: What is", ("role marker 'user:'",)),
    ("Hi\n  Assistant : hello", ("role marker 'Assistant :'",)),
    (" ok\nQuestion: next", ("role marker 'Question:'",)),
    ("x<start_of_turn>", ("role marker '<start_of_turn>'",)),
    (" What is the capital of France? Paris", ("repeats the prompt",)),
    ("The user: said", ()),  # not at a line start
])
def test_problems(reply, found):
    assert problems("What is the capital of France?", reply) == found


@pytest.mark.slow
@pytest.mark.integration
def test_smoke_on_the_tiny_model_with_the_echo_backend(tiny_model_dir, tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "server.cli", "bench", "chat", "--model", str(tiny_model_dir),
         "--backend", "echo", "--formats", "qa", "--max-tokens", "8", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300, check=True).stdout
    runs = json.loads((tmp_path / "bench_chat.json").read_text())
    assert len(runs["qa"]) == 20
    # The echo replays "<bos>Question: <prompt>\nAnswer:", so every reply opens with a role
    # marker and the run misses its target.
    assert all("role marker 'Question:'" in a["problems"] for a in runs["qa"])
    assert "target [qa] no reply repeats a role marker or the user's prompt verbatim: " \
           "0/20 clean" in out and out.rstrip().splitlines()[-2].endswith("MISSED")

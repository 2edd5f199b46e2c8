"""Measured quality control on the real Gemma-3 demo (model tier): a request that starts in
Python source and goes on in German prose starts on the 32k reading, which its code prompt
earns, and moves up mid-stream once the German pushes its running loss over the bound; what
it writes after the move is within the bound on the head it moved to."""

from __future__ import annotations

import re
import sysconfig
from pathlib import Path

import pytest
import torch

from heads.engine.grouped_reading import GroupedReading
from heads.engine.quality_control import QualityController
from heads.engine.types import GenerationRequest, QualityLadder
from heads.model.forward import forward_hidden
from heads.model.weights import Checkpoint, load_checkpoint
from kernels.cache_paths import cache_root
from kernels.row_params import RowParams
from server.model_source import resolve_model_dir
from tests.heads.engine.run_util import run_requests

pytestmark = [pytest.mark.model, pytest.mark.timeout(900)]

BOUND = 0.10
# Python source with a German comment opened at its end: the model goes on in German.
CODE = (Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py").read_text()[:2500]
PROMPT = CODE + "\n\n# Zusammenfassung auf Deutsch:\n# Dieses Modul"
GERMAN = re.compile(r"\b(die|der|und|Sie|von|ist|nicht|wird)\b|[äöüß]")


@pytest.fixture(scope="module")
def demo() -> Checkpoint:
    return load_checkpoint(resolve_model_dir("gemma3-270m", cache_root(expand_user=True))
                           ).with_readings(["32k", "131k"])


def test_code_then_german_moves_up_mid_stream_and_stays_within_the_bound(
        demo: Checkpoint) -> None:
    native = demo.manifest.native
    tok = demo.tokenizers[native.name]
    ids = [native.bos_token_id, *tok.encode(PROMPT)]
    rungs = ("32k+groups", "131k+groups", native.name)
    req = GenerationRequest("code-de", rungs[0], tuple(ids), 96, RowParams(temperature=0.0),
                            frozenset(), ladder=QualityLadder(rungs, BOUND))
    readings = GroupedReading.served(demo)
    [events] = run_requests(demo.model, req, num_kv_blocks=256, readings=readings)
    losses = dict(events[0].prompt_losses or ())
    assert losses["32k+groups"] <= BOUND, losses  # the code prompt earns the cheapest rung
    moves = [m for e in events for m in e.moves]
    assert len(moves) == 1 and moves[0].source == "probes", moves
    move = moves[0]
    assert move.from_head == "32k+groups" and move.loss > BOUND and move.at > 0
    out = [e.token_id for e in events]
    after = tok.decode(out[move.at:])
    assert len(GERMAN.findall(after)) >= 5, after  # it moved because the text went German
    # What it wrote after the move, scored token by token: within the bound on its new head.
    with torch.inference_mode():
        hidden = forward_hidden(demo, native.name, ids + out)
        rows = hidden[len(ids) + move.at - 1:-1]  # predicts out[move.at:]
        controller = QualityController(demo.model.head_output,
                                       {r.name: r for r in readings}, native.name)
        served = controller.prompt_losses(rows, torch.tensor(out[move.at:]), rungs)
    print(f"prompt losses {losses}; {move}; after the move {served}")  # noqa: T201
    assert served[move.to_head] <= BOUND, served

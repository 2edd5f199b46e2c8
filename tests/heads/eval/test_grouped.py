"""A nested head read as a two-level softmax over the native vocabulary (heads.eval.grouped):
its groups partition the native ids, its probabilities sum to one, and its bits equal a
dense computation over every native row."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from heads.eval.grouped import first_level, grouped_token_bits
from heads.eval.measure import GROUPED
from heads.eval.targets import quality_targets
from heads.model.forward import forward_hidden
from heads.model.weights import Checkpoint, load_checkpoint
from heads.vocab.piece_groups import PieceGroups
from server.cli import main

TEXT = "The quick brown fox jumps over the lazy dog; naïve café, 1913."


@pytest.fixture(scope="module")
def ckpt(tiny_model_dir: Path) -> Checkpoint:
    return load_checkpoint(tiny_model_dir, compute_dtype="float32")


def _heads(ckpt: Checkpoint) -> tuple[str, list[str]]:
    heads = sorted(ckpt.manifest.heads, key=lambda h: h.vocab_size)
    split = [h.name for h in heads[:-1] if ckpt.tokenizers[h.name].split is not None]
    assert split  # the tiny model's smaller heads are boundary-preserving
    return heads[-1].name, split


def test_groups_partition_the_native_ids_each_led_by_its_own_piece(ckpt: Checkpoint) -> None:
    _, split = _heads(ckpt)
    for head in split:
        table = ckpt.tokenizers[head].split
        assert table is not None
        g = PieceGroups.from_split(table)
        v, n = table.vocab_size, table.native_size
        assert sorted(g.members.tolist()) == list(range(n)) and g.offsets[-1] == n
        for p in range(v):
            members = g.group(p)
            assert members[0] == p and (members[1:] >= v).all()
            assert (g.piece[members] == p).all()
            assert (g.rank[members] == np.arange(len(members))).all()
        removed = np.arange(v, n)
        assert (g.piece[removed] == table.pieces[table.offsets[removed]]).all()


def _dense_bits(ckpt: Checkpoint, head: str, native: str, ids: list[int],
                piece: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(bits per id, the distribution at the last position [V_native]) from all native rows."""
    v = ckpt.manifest.head(head).vocab_size
    bos = ckpt.manifest.head(native).bos_token_id
    h = forward_hidden(ckpt, native, [bos, *ids]).float()  # [T + 1, d]
    z = h @ ckpt.model.unembedding_rows(native).float().T  # [T + 1, V_native]
    first = torch.log_softmax(z[:, :v], -1)[:, piece]  # each native id's piece
    m = z.max(-1, keepdim=True).values
    mass = torch.zeros(z.shape[0], v).index_add_(1, piece, (z - m).exp())
    within = z - m - mass.log()[:, piece]
    logp = first + within  # [T + 1, V_native]
    bits = -logp[torch.arange(len(ids)), torch.tensor(ids)] / math.log(2)
    return bits.double(), logp[-1].exp()


def test_bits_equal_a_dense_two_level_softmax_that_sums_to_one(ckpt: Checkpoint) -> None:
    native, split = _heads(ckpt)
    ids = ckpt.tokenizers[native].encode(TEXT)
    rows = ckpt.model.unembedding_rows(native).float()
    for head in split:
        table = ckpt.tokenizers[head].split
        assert table is not None
        groups = PieceGroups.from_split(table)
        got, _ = grouped_token_bits(ckpt, native, ids, groups, first_level(ckpt, head), rows)
        want, last = _dense_bits(ckpt, head, native, ids, torch.from_numpy(groups.piece))
        assert got.shape == (len(ids),)
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-4)
        assert float(last.sum()) == pytest.approx(1.0, abs=1e-5)
        # A context-only prefix is not scored; the rest is scored exactly as before.
        tail, _ = grouped_token_bits(ckpt, native, ids, groups, first_level(ckpt, head), rows,
                                     first=5)
        assert (tail[:5] == 0).all() and torch.allclose(tail[5:], got[5:], rtol=1e-6)


def test_cli_eval_scores_the_grouped_reading_and_judges_targets(tiny_model_dir: Path,
                                                               tmp_path: Path, capsys) -> None:
    out = tmp_path / "eval"
    assert main(["heads", "eval", str(tiny_model_dir), "--languages", "en,de", "--max-bytes",
                 "800", "--window-bytes", "400", "--threads", "1", "--grouped", "--out",
                 str(out)]) == 0
    printed = capsys.readouterr().out
    _, split = _heads(load_checkpoint(tiny_model_dir))
    table = json.loads((out / "eval-by-source.json").read_text())
    for row in table.values():
        for head in split:
            g = row[head + GROUPED]
            # It predicts native tokens: the native head's bytes/token, no byte fallback.
            native = max(row.values(), key=lambda r: r["vocab_size"])
            assert g["bytes_per_token"] == native["bytes_per_token"]
            assert g["bpb"] > 0 and g["byte_fallback_share"] == 0
    assert f"{split[0]}{GROUPED}" in printed
    # It scores byte windows only: token windows are refused in one line, not a traceback.
    assert main(["heads", "eval", str(tiny_model_dir), "--languages", "en", "--window-bytes",
                 "0", "--grouped"]) == 2
    assert any(line.startswith(f"target {split[0]}{GROUPED} on de") for line in
               quality_targets(table))


def test_targets_judge_each_source_against_its_bound() -> None:
    def cell(v: int, ratio: float) -> dict:
        return {"vocab_size": v, "bpb_vs_native": ratio}

    table = {"wiki": {"32k": cell(32768, 1.26), "32k+groups": cell(32768, 1.09),
                      "131k": cell(131072, 1.01), "262k": cell(262144, 1.0)},
             "notes": {"32k": cell(32768, 1.5), "131k": cell(131072, 1.03),
                       "262k": cell(262144, 1.0)}}
    lines = quality_targets(table)
    assert "target 32k on wiki <= 1.10x native BPB: 1.260x: MISSED" in lines
    assert "target 32k+groups on wiki <= 1.10x native BPB: 1.090x: MET" in lines
    assert "target 131k on wiki <= 1.02x native BPB: 1.010x: MET" in lines
    assert "target 131k on notes <= 1.02x native BPB: 1.030x: MISSED" in lines
    assert not any("32k on notes" in line for line in lines)  # no bound for that source

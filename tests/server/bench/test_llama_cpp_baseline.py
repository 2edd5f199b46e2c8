"""llama.cpp as a baseline in `bench vs-vllm`: the verdicts it adds (the router by 1.3x, the
native head pinned by 1.0x, no verdict for a smaller pinned head, which llama.cpp does not
serve), and the binary it is given checked before anything starts."""

from __future__ import annotations

import dataclasses

import pytest

from heads.manifest import Manifest
from server.bench.llama_cpp import LABEL, find_binary
from server.bench.vs_vllm import Cell, verdicts


def _cell(server: str, bytes_s: float, shares: dict[str, float] | None = None,
          failed: int = 0) -> Cell:
    return Cell(server, "english", 1, 3, failed, 10.0, bytes_s, 1.0, 1.0, shares or {})


def test_the_router_and_the_pinned_native_head_are_judged_against_llama_cpp(
        tiny_model_dir) -> None:
    m = Manifest.load(tiny_model_dir)
    m = dataclasses.replace(m, heads=tuple(dataclasses.replace(h, bpb=1.0) for h in m.heads))
    native, small = m.native.name, min(m.heads, key=lambda h: h.vocab_size).name
    lines = verdicts([_cell("polyhead", 130.0, {native: 1.0}), _cell(LABEL, 100.0)], m)
    assert all("1.30x llama.cpp (target >= 1.3x)" in line for line in lines) and \
        lines[0].startswith("MET polyhead "), lines
    pinned = verdicts([_cell(f"polyhead:{native}", 99.0), _cell(LABEL, 100.0)], m)
    assert len(pinned) == 1 and pinned[0].startswith(f"MISSED polyhead:{native}") and \
        "0.99x llama.cpp (target >= 1.0x)" in pinned[0], pinned
    assert verdicts([_cell(f"polyhead:{small}", 500.0), _cell(LABEL, 100.0)], m) == []
    (failed,) = verdicts([_cell(f"polyhead:{native}", 99.0), _cell(LABEL, 100.0, failed=1)], m)
    assert failed.endswith("; requests failed: llama.cpp 1 of 4"), failed


def test_a_missing_binary_is_refused_by_name(tmp_path) -> None:
    assert find_binary(None) is None
    with pytest.raises(FileNotFoundError, match="no executable llama-server"):
        find_binary(str(tmp_path / "llama-server"))
    plain = tmp_path / "not-executable"
    plain.write_text("")
    with pytest.raises(FileNotFoundError, match="no executable llama-server"):
        find_binary(str(plain))

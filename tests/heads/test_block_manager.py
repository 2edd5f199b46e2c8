"""KV block bookkeeping: allocation, append across block boundaries, free, no leaks."""

from __future__ import annotations

import pytest

from heads.engine.block_manager import BlockManager, blocks_for
from heads.engine.sequence import Sequence
from kernels.sampling_params import RowParams


def _seq(n_prompt: int) -> Sequence:
    return Sequence(request_id="r", head="h", prompt_ids=list(range(n_prompt)),
                    params=RowParams(temperature=0.0), max_tokens=100)


def test_blocks_for() -> None:
    assert [blocks_for(n, 4) for n in (1, 4, 5, 8, 9)] == [1, 1, 2, 2, 3]


def test_allocate_and_free() -> None:
    bm = BlockManager(num_blocks=10, block_size=4)
    a, b = _seq(5), _seq(4)
    assert bm.can_allocate(a)
    bm.allocate(a)
    bm.allocate(b)
    assert len(a.block_table) == 2 and len(b.block_table) == 1
    assert not set(a.block_table) & set(b.block_table)
    assert bm.num_free == 7
    bm.free(a)
    assert a.block_table == [] and bm.num_free == 9
    bm.free(b)
    assert bm.num_free == 10


def test_allocate_refuses_when_full() -> None:
    bm = BlockManager(num_blocks=2, block_size=4)
    big = _seq(9)
    assert not bm.can_allocate(big)
    with pytest.raises(RuntimeError):
        bm.allocate(big)
    assert bm.num_free == 2


def test_append_takes_a_block_only_at_a_boundary() -> None:
    bm = BlockManager(num_blocks=3, block_size=4)
    s = _seq(4)
    bm.allocate(s)
    s.output_ids.append(7)  # 5 tokens: a second block
    assert bm.can_append(s)
    bm.may_append(s)
    assert len(s.block_table) == 2 and bm.num_free == 1
    for t in range(3):  # 8 tokens: still two blocks
        s.output_ids.append(t)
        bm.may_append(s)
    assert len(s.block_table) == 2
    s.output_ids.append(9)  # 9 tokens: a third block
    bm.may_append(s)
    assert len(s.block_table) == 3 and bm.num_free == 0
    s.output_ids += [10, 11, 12]  # 12 tokens fill all three blocks
    assert bm.can_append(s)
    s.output_ids.append(13)  # the 13th needs a fourth block, and none is free
    assert not bm.can_append(s)
    bm.free(s)
    assert bm.num_free == 3


def test_double_allocate_is_a_bug() -> None:
    bm = BlockManager(num_blocks=4, block_size=4)
    s = _seq(3)
    bm.allocate(s)
    with pytest.raises(RuntimeError):
        bm.allocate(s)

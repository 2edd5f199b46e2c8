"""Scheduler policy and bookkeeping, driven without a model: tokens are appended by hand."""

from __future__ import annotations

import pytest

from heads.engine.block_manager import BlockManager
from heads.engine.scheduler import Scheduler
from heads.engine.sequence import Sequence, SequenceStatus
from heads.errors import EngineOverloaded
from kernels.row_params import RowParams


def _seq(n_prompt: int, max_tokens: int = 8, head: str = "a", stop=frozenset()) -> Sequence:
    return Sequence(request_id="r", head=head, prompt_ids=list(range(2, 2 + n_prompt)),
                    params=RowParams(temperature=0.0), max_tokens=max_tokens,
                    stop_token_ids=stop)


def _sched(blocks: int = 16, block_size: int = 4, max_seqs: int = 8, max_tokens: int = 64,
           max_len: int = 64) -> Scheduler:
    return Scheduler(BlockManager(blocks, block_size), max_seqs, max_tokens, max_len)


def _decode_once(s: Scheduler, token: int = 5) -> list[Sequence]:
    seqs, prefill = s.schedule()
    assert not prefill
    s.postprocess(seqs, [token] * len(seqs))
    return seqs


def test_prefill_then_decode() -> None:
    s = _sched()
    a, b = _seq(5), _seq(3, head="b")
    s.add(a)
    s.add(b)
    assert s.head_counts() == {"a": (0, 1), "b": (0, 1)}
    seqs, prefill = s.schedule()
    assert prefill and seqs == [a, b]
    assert s.head_counts() == {"a": (1, 0), "b": (1, 0)}
    s.postprocess(seqs, [9, 9])
    assert _decode_once(s) == [a, b]
    assert a.output_ids == [9, 5]


def test_prefill_token_budget_and_seq_cap() -> None:
    s = _sched(max_tokens=10, max_seqs=2)
    seqs = [_seq(4, max_tokens=2) for _ in range(4)]
    for q in seqs:
        s.add(q)
    batch, prefill = s.schedule()
    assert prefill and batch == seqs[:2]  # 8 tokens; a third would pass 10 tokens
    batch, prefill = s.schedule()
    assert not prefill and batch == seqs[:2]  # the seq cap holds the rest back


def test_finish_on_length_stop_and_max_model_len() -> None:
    s = _sched(max_len=8)
    by_len, by_stop, by_model_len = _seq(2, max_tokens=2), _seq(2, stop=frozenset({1})), _seq(6)
    for q in (by_len, by_stop, by_model_len):
        s.add(q)
    seqs, _ = s.schedule()
    assert s.postprocess(seqs, [3, 1, 3]) == [([3], None), ([1], "stop"), ([3], None)]
    seqs, _ = s.schedule()
    # max_tokens; 8 tokens in all
    assert s.postprocess(seqs, [3, 3]) == [([3], "length"), ([3], "length")]
    assert s.is_idle and s.block_manager.num_free == 16


def test_preempt_by_recompute_when_blocks_run_out() -> None:
    s = _sched(blocks=4, block_size=4)
    a, b = _seq(4, max_tokens=8), _seq(4, max_tokens=8)
    s.add(a)
    s.add(b)
    seqs, _ = s.schedule()
    s.postprocess(seqs, [5, 5])  # both need a 2nd block next step: 4 blocks in all, fine
    _decode_once(s)
    for _ in range(3):
        _decode_once(s)  # 8 tokens each: blocks full
    # Next step needs a third block for each: a gets one, b is preempted.
    seqs = _decode_once(s)
    assert seqs == [a] and b.status is SequenceStatus.WAITING and b.block_table == []
    assert s.num_preemptions == 1 and list(s.waiting) == [b]
    # b is re-prefilled over prompt + outputs once a finishes.
    while not a.is_finished:
        _decode_once(s)
    seqs, prefill = s.schedule()
    assert prefill and seqs == [b] and len(b.block_table) == 3
    while not b.is_finished:
        _decode_once(s)
    assert len(a.output_ids) == len(b.output_ids) == 8
    assert s.is_idle and s.block_manager.num_free == 4


def test_abort_frees_blocks_wherever_the_sequence_is() -> None:
    s = _sched(blocks=4, block_size=4, max_seqs=1)
    a, b = _seq(6), _seq(3)
    s.add(a)
    s.add(b)
    s.schedule()
    assert s.block_manager.num_free == 2
    s.finish(a, "abort")
    s.finish(b, "abort")  # still waiting
    s.finish(b, "abort")  # twice is harmless
    assert s.is_idle and s.block_manager.num_free == 4
    assert a.finish_reason == b.finish_reason == "abort"


@pytest.mark.parametrize(
    ("prompt", "max_tokens"),
    [(20, 1), (4, 30), (64, 1)],  # > blocks, > blocks with outputs, >= max_model_len
)
def test_requests_that_can_never_fit_are_refused(prompt: int, max_tokens: int) -> None:
    s = _sched(blocks=4, block_size=4, max_tokens=64, max_len=64)
    with pytest.raises(EngineOverloaded):
        s.add(_seq(prompt, max_tokens=max_tokens))
    assert s.is_idle


def test_a_prompt_over_the_token_budget_runs_alone() -> None:
    s = _sched(blocks=64, max_tokens=8)
    small, big, after = _seq(3), _seq(12), _seq(3)
    for q in (small, big, after):
        s.add(q)
    assert s.schedule() == ([small], True)  # big would pass the budget in company
    assert s.schedule() == ([big], True)  # alone it runs anyway
    assert s.schedule() == ([after], True)

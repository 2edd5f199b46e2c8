"""KV block bookkeeping: allocation, append across block boundaries, free, no leaks."""

from __future__ import annotations

import pytest

from heads.engine.block_manager import BlockManager, blocks_for
from heads.engine.sequence import Sequence
from kernels.row_params import RowParams


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


# --- prefix caching ----------------------------------------------------------------------------


def _pseq(ids: list[int], head: str = "h") -> Sequence:
    return Sequence(request_id="r", head=head, prompt_ids=list(ids),
                    params=RowParams(temperature=0.0), max_tokens=100)


def test_full_blocks_are_shared_and_counted_once() -> None:
    bm = BlockManager(num_blocks=10, block_size=4)
    a, b = _pseq(list(range(10))), _pseq(list(range(9)) + [99])
    bm.allocate(a)
    assert a.num_cached_tokens == 0 and bm.num_free == 7
    bm.allocate(b)  # the same first two blocks; the partial third one is its own
    assert b.num_cached_tokens == 8 and b.cached_prompt_tokens == 8
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert bm.num_free == 6  # 4 blocks held: the shared two count once
    bm.free(a)
    assert bm.num_free == 7  # the shared blocks stay held by b
    bm.free(b)
    assert bm.num_free == 10
    assert bm.stats.queries == {"h": 20} and bm.stats.hits == {"h": 8}


def test_the_last_token_is_always_computed() -> None:
    bm = BlockManager(num_blocks=10, block_size=4)
    a = _pseq(list(range(8)))
    bm.allocate(a)
    bm.free(a)
    again = _pseq(list(range(8)))  # both blocks are cached, yet the last one is recomputed
    bm.allocate(again)
    assert again.num_cached_tokens == 4


def test_the_cache_is_per_head_and_can_be_switched_off() -> None:
    bm = BlockManager(num_blocks=10, block_size=4)
    bm.allocate(_pseq(list(range(9)), head="a"))
    other = _pseq(list(range(9)), head="b")
    bm.allocate(other)
    assert other.num_cached_tokens == 0
    off = BlockManager(num_blocks=10, block_size=4, prefix_caching=False)
    s = _pseq(list(range(9)))
    off.allocate(s)
    off.free(s)
    s2 = _pseq(list(range(9)))
    off.allocate(s2)
    assert s2.num_cached_tokens == 0 and off.num_cached == 0


def test_freed_blocks_stay_findable_until_reused_least_recent_first() -> None:
    bm = BlockManager(num_blocks=4, block_size=4)
    a = _pseq(list(range(9)))  # 3 blocks, two of them full and keyed
    bm.allocate(a)
    bm.free(a)
    assert bm.num_free == 4 and bm.num_cached == 2
    filler = _pseq([50])  # takes the never-used block first, then the oldest freed one
    bm.allocate(filler)
    hit = _pseq(list(range(9)))
    bm.allocate(hit)
    assert hit.num_cached_tokens == 8
    bm.free(hit)
    bm.free(filler)
    # Now evict: a sequence needing every block overwrites all the cached content.
    big = _pseq([70 + i for i in range(16)])
    bm.allocate(big)
    assert bm.num_cached == 4  # only big's own (full) blocks remain keyed
    bm.free(big)
    miss = _pseq(list(range(9)))
    bm.allocate(miss)
    assert miss.num_cached_tokens == 0


def test_eviction_takes_tail_blocks_before_the_shared_prefix() -> None:
    bm = BlockManager(num_blocks=4, block_size=4)
    a = _pseq(list(range(13)))  # blocks: p0 p1 p2 + partial
    bm.allocate(a)
    bm.free(a)
    bm.allocate(_pseq([60]))  # evicts one block: the partial tail, queued first
    hit = _pseq(list(range(13)))
    assert bm.can_allocate(hit) is False  # 4 needed, 3 free
    short = _pseq(list(range(9)))
    bm.allocate(short)
    assert short.num_cached_tokens == 8  # p0, p1 survived


def test_decode_keys_a_block_when_it_fills() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    s = _pseq([1, 2, 3, 4, 5])
    bm.allocate(s)
    for t in (6, 7, 8):  # the third token completes the second block
        s.output_ids.append(t)
        bm.may_append(s)
    bm.free(s)
    again = _pseq([1, 2, 3, 4, 5, 6, 7, 8, 9])
    bm.allocate(again)
    assert again.num_cached_tokens == 8


def test_admission_counts_blocks_held_by_others_as_free_of_cost() -> None:
    bm = BlockManager(num_blocks=3, block_size=4)
    a = _pseq(list(range(9)))  # 3 blocks, none left
    bm.allocate(a)
    twin = _pseq(list(range(8)) + [42])  # shares 2 held blocks, needs 1 new: none free
    assert not bm.can_allocate(twin)
    shorter = _pseq(list(range(8)))  # shares block 0, recomputes block 1: needs 1 new
    assert not bm.can_allocate(shorter)
    bm.free(a)
    assert bm.can_allocate(twin)


def test_collisions_are_ruled_out_by_the_stored_ids(monkeypatch) -> None:
    import heads.engine.block_manager as mod

    monkeypatch.setattr(mod, "chain_hash", lambda parent, head, toks: 7)  # every key collides
    bm = BlockManager(num_blocks=8, block_size=4)
    bm.allocate(_pseq([1, 2, 3, 4, 5]))
    other = _pseq([9, 9, 9, 9, 5])
    bm.allocate(other)
    assert other.num_cached_tokens == 0


# --- sliding-window groups ---------------------------------------------------------------------


def test_sliding_groups_hand_back_blocks_behind_the_window() -> None:
    from heads.engine.kv_layout import KVLayout

    layout = KVLayout((None, 8), (0, 1), (0, 0), 1)  # one full layer, one of window 8
    bm = BlockManager(num_blocks=40, block_size=4, prefix_caching=False, layout=layout)
    s = _pseq(list(range(30)))
    bm.allocate(s)
    full, sliding = s.block_tables
    assert len(full) == 8 and sliding[:5] == [bm.pad] * 5  # (30 - 8) // 4 = 5
    assert bm.num_free == 40 - 8 - 3
    for t in range(6):
        s.output_ids.append(t)
        bm.may_append(s)  # 36 tokens: keep from (36 - 8) // 4 = 7 on
    assert s.block_tables[1][:7] == [bm.pad] * 7 and len(s.block_tables[1]) == 9
    assert bm.num_free == 40 - 9 - 2
    assert bm.blocks_needed(36) == 9 + 4  # the window plus the block being filled
    bm.free(s)
    assert bm.num_free == 40


def test_a_hit_finds_the_window_before_the_cut_after_it_was_handed_back() -> None:
    from heads.engine.kv_layout import KVLayout

    layout = KVLayout((None, 8, 8), (0, 1, 2), (0, 0, 0), 1)
    bm = BlockManager(num_blocks=60, block_size=4, layout=layout)
    a = _pseq(list(range(30)))
    bm.allocate(a)  # with caching every block is written, then trimmed after the step
    written = [list(t) for t in a.block_tables]
    assert all(bm.pad not in t for t in written)
    a.output_ids.append(99)
    bm.trim(a)
    assert a.block_tables[1][:5] == [bm.pad] * 5 and a.block_tables[0] == written[0]
    b = _pseq(list(range(20)) + [7, 7])  # cut at 20: sliding blocks (21 - 8) // 4 = 3 and 4
    bm.allocate(b)
    assert b.num_cached_tokens == 20
    for g in (1, 2):
        assert b.block_tables[g][:3] == [bm.pad] * 3
        assert b.block_tables[g][3:5] == written[g][3:5]  # handed back by a, still keyed
    bm.free(a)
    bm.free(b)
    bm.reset_cache()
    c = _pseq(list(range(20)) + [8, 8])
    bm.allocate(c)
    assert c.num_cached_tokens == 0


@pytest.mark.parametrize("caching", [True, False])
def test_longest_sequence_is_the_most_tokens_the_pool_holds(caching: bool) -> None:
    from heads.engine.kv_layout import KVLayout

    layout = KVLayout((None, 8), (0, 1), (0, 0), 1)  # one full layer, one of window 8
    bm = BlockManager(num_blocks=12, block_size=4, prefix_caching=caching, layout=layout)
    n = bm.longest_sequence(1000)
    assert bm.blocks_needed(n) <= bm.num_blocks < bm.blocks_needed(n + 1)
    # Caching: each group holds every block (6 x 4 tokens); without, the window's group
    # peaks at 8 / 4 + 2 blocks, leaving 8 for the full group.
    assert n == (24 if caching else 32)
    assert bm.longest_sequence(10) == 10  # the context is the limit when the pool is not

"""LocalEngine end to end on a tiny three-head model (V = 1000 / 400 / 128, one shared matrix)."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from heads.engine.config import EngineConfig
from heads.engine.llm_engine import LocalEngine
from heads.engine.types import GenerationRequest, HeadLoad, TokenEvent
from heads.errors import EngineError, EngineOverloaded, EngineStopped
from heads.model.multi_head import MultiHeadModel
from kernels.row_params import RowParams
from tests.heads.tiny import HEADS, tiny_model

GREEDY = RowParams(temperature=0.0)


@pytest.fixture(scope="module")
def model() -> MultiHeadModel:
    return tiny_model()


def _req(head: str, prompt: tuple[int, ...] = (5, 6, 7, 9, 11), max_tokens: int = 12,
         sampling: RowParams = GREEDY, stop: frozenset[int] = frozenset(),
         want_logprobs: bool = False, rid: str = "r") -> GenerationRequest:
    return GenerationRequest(rid, head, prompt, max_tokens, sampling, stop, want_logprobs)


async def _collect(engine: LocalEngine, req: GenerationRequest) -> list[TokenEvent]:
    return [ev async for ev in engine.generate(req)]


def _ids(events: list[TokenEvent]) -> list[int]:
    return [e.token_id for e in events]


async def _wait_for(cond, timeout: float = 5.0) -> None:
    # Aborts are applied by the step thread, so their effect shows up shortly after.
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


async def _until_all_free(engine: LocalEngine) -> None:
    await _wait_for(lambda: engine.free_blocks() == engine.total_blocks())


def _slow_down(engine: LocalEngine, seconds: float) -> None:
    # Makes each step take a while, so a test can act in the middle of a stream.
    real = engine._runner.run

    def run(*args, **kwargs):
        time.sleep(seconds)
        return real(*args, **kwargs)

    engine._runner.run = run  # type: ignore[method-assign]


def _run(model: MultiHeadModel, body, **config) -> object:
    async def main() -> object:
        engine = LocalEngine(model, EngineConfig(**({"num_kv_blocks": 64} | config)))
        await engine.start()
        try:
            return await body(engine)
        finally:
            await engine.shutdown()

    return asyncio.run(main())


def _alone(model: MultiHeadModel, req: GenerationRequest) -> list[TokenEvent]:
    return _run(model, lambda e: _collect(e, req))  # type: ignore[return-value]


def test_mixed_heads_in_one_batch_match_running_alone(model) -> None:
    reqs = [
        _req(head, prompt=tuple(range(3 + i, 3 + i + 4 + 3 * i)), max_tokens=10 + i, rid=str(i))
        for i, head in enumerate(["1k", "400", "128", "1k", "128", "400"])
    ]
    alone = [_ids(_alone(model, r)) for r in reqs]

    async def together(engine: LocalEngine) -> list[list[TokenEvent]]:
        return await asyncio.gather(*(_collect(engine, r) for r in reqs))

    batched = _run(model, together)
    assert [_ids(ev) for ev in batched] == alone
    for r, ev in zip(reqs, batched, strict=True):
        assert len(ev) == r.max_tokens and all(e.token_id < HEADS[r.head] for e in ev)
        assert [e.finish_reason for e in ev] == [None] * (r.max_tokens - 1) + ["length"]
    assert len({tuple(a) for a in alone}) == len(alone)  # the heads really differ


def test_preemption_by_recompute_keeps_outputs(model) -> None:
    # 8 blocks of 4 tokens: three sequences of 4 + 12 tokens (4 blocks each) cannot all stay.
    reqs = [_req(h, prompt=(10 + i, 20, 30, 40), max_tokens=12, rid=str(i))
            for i, h in enumerate(["1k", "400", "128"])]
    alone = [_ids(_alone(model, r)) for r in reqs]

    async def together(engine: LocalEngine) -> tuple[list[list[int]], int]:
        out = await asyncio.gather(*(_collect(engine, r) for r in reqs))
        await _until_all_free(engine)
        return [_ids(e) for e in out], engine._scheduler.num_preemptions

    out, preemptions = _run(model, together, num_kv_blocks=8, block_size=4)
    assert out == alone
    assert preemptions > 0


def test_stop_token_ends_the_stream_with_the_stop_token(model) -> None:
    free_run = _ids(_alone(model, _req("400", max_tokens=20)))
    stop = free_run[5]
    cut = free_run.index(stop)
    events = _alone(model, _req("400", max_tokens=20, stop=frozenset({stop, 399})))
    assert _ids(events) == free_run[: cut + 1]
    assert events[-1].finish_reason == "stop"


def test_max_model_len_ends_with_length(model) -> None:
    events = _run(model, lambda e: _collect(e, _req("1k", max_tokens=100)), max_model_len=20)
    assert len(events) == 15 and events[-1].finish_reason == "length"  # 5 prompt + 15


def test_seeded_sampling_is_reproducible_across_runs_and_batches(model) -> None:
    params = RowParams(temperature=0.9, top_k=50, top_p=0.95, seed=1234)
    target = _req("1k", max_tokens=16, sampling=params, rid="t")
    first = _ids(_alone(model, target))
    assert _ids(_alone(model, target)) == first

    others = [
        _req("128", max_tokens=20, sampling=RowParams(temperature=1.0, seed=7), rid="a"),
        _req("1k", prompt=(8, 8, 8), max_tokens=5, rid="b"),
        _req("1k", max_tokens=16, sampling=RowParams(temperature=0.9, seed=99), rid="c"),
    ]

    async def mixed(engine: LocalEngine) -> list[list[TokenEvent]]:
        return await asyncio.gather(*(_collect(engine, r) for r in [*others, target]))

    results = _run(model, mixed)
    assert _ids(results[-1]) == first
    assert _ids(results[2]) != first  # another seed on the same prompt samples differently
    assert all(e.token_id < 128 for e in results[0])


def test_logprobs_only_when_asked(model) -> None:
    with_lp = _alone(model, _req("128", max_tokens=4, want_logprobs=True))
    without = _alone(model, _req("128", max_tokens=4))
    assert all(e.logprob is not None and e.logprob <= 0.0 for e in with_lp)
    assert all(e.logprob is None for e in without)
    assert _ids(with_lp) == _ids(without)


@pytest.mark.parametrize("how", ["aclose", "cancel"])
def test_consumer_leaving_mid_stream_frees_all_blocks(model, how: str) -> None:
    async def body(engine: LocalEngine) -> list[int]:
        _slow_down(engine, 0.01)  # 100 tokens would take >= 1 s
        other = asyncio.create_task(_collect(engine, _req("1k", max_tokens=40, rid="o")))
        got: list[int] = []
        if how == "aclose":
            stream = engine.generate(_req("400", max_tokens=100, rid="x"))
            async with contextlib.aclosing(stream):
                async for ev in stream:
                    got.append(ev.token_id)
                    if len(got) == 3:
                        break
        else:
            async def consume() -> None:
                async for ev in engine.generate(_req("400", max_tokens=100, rid="x")):
                    got.append(ev.token_id)

            task = asyncio.create_task(consume())
            while len(got) < 3:
                await asyncio.sleep(0.001)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        # The abort lands within a step or two, long before the stream would have ended.
        await _wait_for(lambda: engine.head_load()["400"] == HeadLoad(0, 0), timeout=0.5)
        assert len(await other) == 40  # the neighbour is unaffected
        await _wait_for(lambda: engine.free_blocks() == engine.total_blocks())
        return got

    assert 3 <= len(_run(model, body)) < 100


def test_request_that_can_never_fit_is_refused(model) -> None:
    async def body(engine: LocalEngine) -> None:
        with pytest.raises(EngineOverloaded):
            engine.generate(_req("1k", prompt=tuple(range(2, 40)), max_tokens=40))
        with pytest.raises(EngineError):
            engine.generate(_req("nope"))
        with pytest.raises(EngineError):
            engine.generate(_req("128", prompt=(5, 128)))  # id outside the head
        assert engine.free_blocks() == engine.total_blocks()

    _run(model, body, num_kv_blocks=4, block_size=16)  # 64 tokens of KV in all


def test_step_failure_fails_its_requests_and_the_engine_recovers(model) -> None:
    async def body(engine: LocalEngine) -> None:
        real = engine._runner.run

        def broken(*args, **kwargs):
            raise RuntimeError("boom")

        engine._runner.run = broken  # type: ignore[method-assign]
        with pytest.raises(EngineError, match="boom"):
            await asyncio.wait_for(_collect(engine, _req("1k")), 5)
        engine._runner.run = real  # type: ignore[method-assign]
        await _until_all_free(engine)
        assert len(await _collect(engine, _req("1k", max_tokens=3))) == 3

    _run(model, body)


def test_head_load_counts_waiting_then_shutdown_stops_everything(model) -> None:
    async def main() -> None:
        engine = LocalEngine(model, EngineConfig(num_kv_blocks=64))
        _slow_down(engine, 0.005)
        got: list[int] = []

        async def consume(head: str) -> None:
            async for ev in engine.generate(_req(head, max_tokens=100)):
                got.append(ev.token_id)

        # Not started: the requests queue and show up as waiting on their heads.
        tasks = [asyncio.create_task(consume(h)) for h in ("128", "128", "400")]
        await asyncio.sleep(0.01)
        load = engine.head_load()
        assert set(load) == set(HEADS)
        assert (load["128"].waiting, load["400"].waiting, load["1k"].waiting) == (2, 1, 0)
        await engine.start()
        while len(got) < 6:
            await asyncio.sleep(0.001)
        assert engine.head_load()["128"].running == 2
        await engine.shutdown()
        for task in tasks:
            with pytest.raises(EngineStopped):
                await task
        assert len(got) < 300
        with pytest.raises(EngineStopped):
            engine.generate(_req("1k"))
        assert engine.free_blocks() == engine.total_blocks()

    asyncio.run(main())


def test_idle_engine_does_not_spin(model) -> None:
    async def body(engine: LocalEngine) -> float:
        await _collect(engine, _req("1k", max_tokens=5))
        await asyncio.sleep(0.05)
        start = time.process_time()
        await asyncio.sleep(0.5)
        return time.process_time() - start

    assert _run(model, body) < 0.1  # CPU seconds over 0.5 s of wall time, all threads


# --- prefix caching ----------------------------------------------------------------------------

_SYSTEM = tuple(range(3, 3 + 37))  # 37 tokens: two full blocks of 16 and a partial one


def test_greedy_output_is_identical_with_and_without_a_cache_hit(model) -> None:
    first = _req("1k", prompt=_SYSTEM + (200, 201), max_tokens=10, rid="first")
    second = _req("1k", prompt=_SYSTEM + (300,), max_tokens=10, rid="second")

    async def in_turn(engine: LocalEngine) -> list[list[TokenEvent]]:
        return [await _collect(engine, first), await _collect(engine, second)]

    warm = _run(model, in_turn)
    cold = _run(model, in_turn, enable_prefix_caching=False)
    assert [_ids(e) for e in warm] == [_ids(e) for e in cold]
    assert warm[0][0].cached_tokens == 0 and warm[1][0].cached_tokens == 32
    assert all(e.cached_tokens is None for e in warm[1][1:])
    assert cold[1][0].cached_tokens == 0


def test_hits_are_per_head_and_counted_in_tokens(model) -> None:
    async def body(engine: LocalEngine) -> tuple[list[int | None], dict[str, tuple[int, int]]]:
        hits = []
        for head, rid in (("1k", "a"), ("1k", "b"), ("400", "c")):
            events = await _collect(engine, _req(head, prompt=_SYSTEM, max_tokens=2, rid=rid))
            hits.append(events[0].cached_tokens)
        await _until_all_free(engine)
        return hits, engine.prefix_cache_counts()

    hits, counts = _run(model, body)
    assert hits == [0, 32, 0]  # the same ids under another head are other tokens
    assert counts == {"1k": (74, 32), "400": (37, 0)}


def test_preemption_with_shared_prefixes_keeps_outputs(model) -> None:
    # 12 blocks of 4: three sequences of 12 + 16 tokens share the first 3 blocks; the cache
    # runs out mid-decode, so preempted sequences come back partly from the cache.
    base = tuple(range(50, 62))
    reqs = [_req(h, prompt=base + (i,), max_tokens=16, rid=str(i))
            for i, h in enumerate(["1k", "1k", "1k"])]
    alone = [_ids(_run(model, lambda e, r=r: _collect(e, r), enable_prefix_caching=False))
             for r in reqs]

    async def together(engine: LocalEngine) -> tuple[list[list[int]], int]:
        out = await asyncio.gather(*(_collect(engine, r) for r in reqs))
        await _until_all_free(engine)
        return [_ids(e) for e in out], engine._scheduler.num_preemptions

    out, preemptions = _run(model, together, num_kv_blocks=12, block_size=4)
    assert out == alone
    assert preemptions > 0

"""The router prices a mixed step as the engine runs it: heads nested in one matrix share one
read of the largest live head's rows when `kernels.nested_plan` picks the nested pass, which
is the rule the engine's model runner asks, on every shape."""

from __future__ import annotations

import pytest

from kernels.crossover import DEFAULT_MODE, dtype_for_bytes
from kernels.devices import DEVICES
from kernels.nested_plan import GroupShape, effective_batch, plan_nested
from kernels.selector import choose
from router.cost import (
    AnalyticTimer,
    Group,
    marginal_step_s,
    mixed_step_cost,
    split_kernel,
    unembed_passes,
)
from router.profiles import HeadProfile

D = 640
MIXES = [
    {262_144: 1, 131_072: 1}, {262_144: 4, 32_768: 4}, {262_144: 1, 131_072: 8, 32_768: 8},
    {131_072: 2, 32_768: 14}, {262_144: 16, 32_768: 1}, {262_144: 64, 131_072: 64},
    {262_144: 300, 32_768: 700}, {131_072: 1, 32_768: 1},
]


def _head(vocab: int, s: float = 4.0, shared: str | None = "matrices.shared") -> HeadProfile:
    return HeadProfile(f"v{vocab}", vocab, D, backbone_params=100_000_000,
                       kv_bytes_per_token=20_000.0, weight_bytes_per_param=s,
                       shared_rows=shared)


def _groups(mix: dict[int, int], s: float = 4.0, shared: str | None = "matrices.shared"
            ) -> list[Group]:
    return [Group(_head(v, s, shared), b, 100.0) for v, b in mix.items()]


@pytest.mark.parametrize("device", ["cpu", "a10g", "h200"])
@pytest.mark.parametrize("s", [2.0, 4.0])
@pytest.mark.parametrize("mix", MIXES, ids=lambda m: "+".join(f"{v}x{b}" for v, b in m.items()))
def test_router_and_engine_rule_agree_on_the_nested_pass(device: str, s: float, mix) -> None:
    spec, groups = DEVICES[device], _groups(mix, s)
    shapes = [GroupShape(b, v) for v, b in mix.items()]
    engine = plan_nested(shapes, D, dtype_for_bytes(s), DEFAULT_MODE, spec)
    passes = unembed_passes(groups, spec)
    assert (len(passes) == 1) == engine.nested
    if engine.nested:
        # The nested pass's kernel: the engine's selector on the FLOP-equivalent batch.
        b_eff = effective_batch(shapes)
        kernel = choose(b_eff, max(mix), D, dtype_for_bytes(s), DEFAULT_MODE, spec).kernel
        top = max((g.head for g in groups), key=lambda h: h.vocab_size)
        assert split_kernel(Group(top, b_eff, 0.0), spec) == (kernel == "split")


def test_a_nested_step_reads_the_largest_head_once() -> None:
    spec = DEVICES["cpu"]
    nested = mixed_step_cost(_groups({262_144: 1, 131_072: 1}), spec)
    alone = mixed_step_cost(_groups({262_144: 2}), spec)
    assert nested.unembed_s == pytest.approx(262_144 * D * 4.0 / spec.mem_bw)
    assert nested.unembed_s == alone.unembed_s
    assert nested.compute_s < alone.compute_s  # the 131k row's FLOPs stop at its own V


def test_heads_with_their_own_rows_are_priced_per_group() -> None:
    spec = DEVICES["cpu"]
    own = mixed_step_cost(_groups({262_144: 1, 131_072: 1}, shared=None), spec)
    assert own.unembed_s == pytest.approx((262_144 + 131_072) * D * 4.0 / spec.mem_bw)
    # Two matrices of different names never share a read either.
    a, b = _head(262_144, shared="m.a"), _head(131_072, shared="m.b")
    assert len(unembed_passes([Group(a, 1, 0.0), Group(b, 1, 0.0)], spec)) == 2


def test_a_smaller_head_is_nearly_free_while_a_larger_one_is_live() -> None:
    timer = AnalyticTimer(DEVICES["cpu"])
    big, small = _head(262_144), _head(32_768)
    live = [Group(big, 4, 100.0)]
    on_small = marginal_step_s(small, timer, live, 100.0)
    on_big = marginal_step_s(big, timer, live, 100.0)
    opening = marginal_step_s(_head(32_768, shared=None), timer, live, 100.0)
    # Joining the nested pass adds FLOPs only; opening a separate 32k pass adds its read too.
    assert on_small <= on_big
    assert on_small < 0.5 * opening


def _snapshot(smoothed: dict[str, float]):  # type: ignore[no-untyped-def]
    from router.state import StateSnapshot

    return StateSnapshot(running={}, waiting={}, served_bytes={}, served_tokens={},
                         training_bytes={}, smoothed_running=smoothed)


def test_the_regime_prices_heads_under_the_live_mix() -> None:
    from router.policy.builtin import CostPolicy, regime_mix
    from router.policy.spec import CostParams

    def profiles(shared: str | None) -> list[HeadProfile]:
        return [HeadProfile(f"v{v}", v, D, 100_000_000, 20_000.0, 4.0, bytes_per_token=4.5,
                            shared_rows=shared) for v in (32_768, 131_072, 262_144)]

    ctx = {f"v{v}": 100.0 for v in (32_768, 131_072, 262_144)}
    # The quality bound holds 4 requests on 262k; the regime head 131k runs 8.
    snap = _snapshot({"v262144": 4.0, "v131072": 8.0})
    ps = profiles("matrices.shared")
    mix = regime_mix(snap, ps, ps[1], "v131072", ctx)
    assert sorted((g.head.name, g.batch) for g in mix) == [("v131072", 9), ("v262144", 4)]
    # A candidate larger than the held groups takes all of them.
    assert [(g.head.name, g.batch) for g in regime_mix(snap, ps, ps[2], "v131072", ctx)] == [
        ("v262144", 13)]
    policy = CostPolicy(DEVICES["cpu"], CostParams(margin=0, min_dwell_s=0))
    nested = {p.name: policy.objective(p, regime_mix(snap, ps, p, "v131072", ctx), 0.0)
              for p in ps}
    # Under the live mix the 131k regime shares the 262k group's read: per byte it costs
    # less than moving everything to 262k, and no more than the step's FLOPs say.
    assert nested["v131072"] < nested["v262144"]
    own = profiles(None)
    alone = {p.name: policy.objective(p, regime_mix(snap, own, p, "v131072", ctx), 0.0)
             for p in own}
    # With separate matrices the same mix pays two reads, so 131k costs more than 262k alone.
    assert alone["v131072"] > alone["v262144"]
    # With no held head yet, every request goes to the candidate (the switch's steady state).
    assert [(g.head.name, g.batch) for g in regime_mix(snap, ps, ps[0], None, ctx)] == [
        ("v32768", 13)]

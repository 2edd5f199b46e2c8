"""A split head's two-level reading as the router sees it: priced as its split head's rows plus
one group of native rows per sequence, its penalty predicted from its split head's split
share, fitted from `heads eval --grouped` rows, and never chosen for a request that needs
every id's logit."""

from __future__ import annotations

import dataclasses

import pytest

from kernels.devices import DEVICES
from router.cost import Group, mixed_step_cost
from router.errors import ReadingLacksLogits
from router.profiles import HeadProfile, HeadTokens, RequestFeatures
from router.router import Router
from router.segmentation import PenaltyFit, fit_by_head, fit_points, penalties
from router.state import LiveState

CPU = DEVICES["cpu"]
D, S = 640, 4.0


def _head(name: str, vocab: int, **kw: object) -> HeadProfile:
    return HeadProfile(name, vocab, D, backbone_params=100_000_000, kv_bytes_per_token=20_000.0,
                       weight_bytes_per_param=S, shared_rows="matrices.shared", **kw)  # type: ignore[arg-type]


NATIVE = _head("262k", 262_144, bytes_per_token=4.6)
SPLIT = _head("32k", 32_768, bytes_per_token=3.9, bpb_penalty=(3.6, 0.0, 0.09))
READING = _head("32k+groups", 32_768, bytes_per_token=4.6, group_rows=750.0, reads="32k",
                bpb_penalty=(1.2, 0.0, 0.09))


def test_a_reading_step_reads_its_split_heads_rows_and_one_group_per_sequence() -> None:
    alone = mixed_step_cost([Group(SPLIT, 4, 100.0)], CPU)
    reading = mixed_step_cost([Group(READING, 4, 100.0)], CPU)
    assert reading.unembed_s * CPU.mem_bw == pytest.approx(
        alone.unembed_s * CPU.mem_bw + 4 * 750 * D * S)
    assert reading.compute_s > alone.compute_s
    # Beside the native head, its first level shares the native rows' one read.
    mixed = mixed_step_cost([Group(NATIVE, 4, 100.0), Group(READING, 4, 100.0)], CPU)
    native = mixed_step_cost([Group(NATIVE, 8, 100.0)], CPU)
    assert mixed.unembed_s * CPU.mem_bw == pytest.approx(
        native.unembed_s * CPU.mem_bw + 4 * 750 * D * S)


def _features(split_tokens: int, native_tokens: int = 200) -> RequestFeatures:
    # The reading tokenizes natively: its own count equals the native head's.
    return RequestFeatures(900, 64, tokens={
        "262k": HeadTokens(native_tokens), "32k": HeadTokens(split_tokens),
        "32k+groups": HeadTokens(native_tokens)}, script="latin")


def test_a_readings_penalty_follows_its_split_heads_split_share() -> None:
    profiles = [SPLIT, READING, NATIVE]
    code = penalties(profiles, _features(202), PenaltyFit(2.61, 0.0))  # 1% split
    prose = penalties(profiles, _features(240), PenaltyFit(2.61, 0.0))  # 17% split
    assert code["262k"] == 0.0
    assert code["32k+groups"] < prose["32k+groups"]
    # Same split share as its split head, a smaller slope: a smaller loss.
    assert prose["32k+groups"] == pytest.approx(prose["32k"] * 1.2 / 3.6)


def test_a_readings_fit_uses_its_split_heads_split_share() -> None:
    table = {lang: {"262k": {"bytes_per_token": 4.0, "bpb": 1.0},
                    "32k": {"bytes_per_token": 4.0 * (1 - share), "bpb": 1.0 + 3 * share},
                    "32k+groups": {"bytes_per_token": 4.0, "bpb": 1.0 + share}}
             for lang, share in (("en", 0.1), ("de", 0.2))}
    vocab = {"262k": 262_144, "32k": 32_768, "32k+groups": 32_768}
    pts = fit_points(table, vocab, {"32k+groups": "32k"})
    reading = [(s, x, y) for s, h, x, _, y in pts if h == "32k+groups"]
    assert reading == [("en", pytest.approx(0.1), pytest.approx(0.1)),
                       ("de", pytest.approx(0.2), pytest.approx(0.2))]
    fits = fit_by_head(pts)
    assert fits["32k+groups"][0].per_split == pytest.approx(1.0)
    assert fits["32k"][0].per_split == pytest.approx(3.0)
    # Without the mapping its own (native) segmentation says it splits nothing.
    assert {x for _, h, x, _, _ in fit_points(table, vocab) if h == "32k+groups"} == {0.0}


def test_a_request_that_needs_every_logit_never_goes_to_a_reading() -> None:
    profiles = [SPLIT, READING, NATIVE]
    router = Router(profiles, CPU, LiveState.for_profiles(profiles),
                    {"name": "pinned", "params": {"head": "32k+groups"}})
    assert router.decide(_features(202)).head == "32k+groups"
    with pytest.raises(ReadingLacksLogits, match="two-level reading"):
        router.decide(dataclasses.replace(_features(202), needs_logits=True))
    cost = Router(profiles, CPU, LiveState.for_profiles(profiles),
                  {"name": "cost", "params": {}})
    assert cost.decide(dataclasses.replace(_features(202), needs_logits=True)).head != \
        "32k+groups"


MID = _head("131k+groups", 131_072, bytes_per_token=4.6, group_rows=20.0, reads="131k")
LADDERED = [SPLIT, READING, MID, NATIVE]


def _measured(policy: dict, drained: str | None = None) -> Router:
    router = Router(LADDERED, CPU, LiveState.for_profiles(LADDERED), policy,
                    measured_readings=True)
    if drained:
        router.set_drained(drained, True)
    return router


def test_a_measured_reading_is_not_excluded_by_its_prediction_and_carries_its_ladder() -> None:
    lifecycle = {"name": "lifecycle", "params": {"max_bpb_loss": 0.05}}
    prose = _features(240)  # predicted +20% on the reading: past a 5% bound
    predicted = Router(LADDERED, CPU, LiveState.for_profiles(LADDERED), lifecycle)
    d = predicted.decide(prose)
    assert d.head != "32k+groups" and d.ladder == ()
    d = _measured(lifecycle).decide(prose)
    assert d.head == "32k+groups", d.reason  # the cheapest head, measured by the engine
    assert d.ladder == ("32k+groups", "131k+groups", "262k")
    assert "ladder" in d.to_record() and d.to_record()["ladder"] == list(d.ladder)
    # A drained rung is skipped; a pinned policy or a pinned request has no ladder.
    assert _measured(lifecycle, "131k+groups").decide(prose).ladder == ("32k+groups", "262k")
    pinned = _measured({"name": "pinned", "params": {"head": "32k+groups"}})
    assert pinned.decide(prose).ladder == ()
    request_pin = dataclasses.replace(prose, pinned_head="32k+groups")
    assert _measured(lifecycle).decide(request_pin).ladder == ()


def test_a_zero_bound_serves_the_native_head_with_a_reading_drafting() -> None:
    exact = {"name": "lifecycle", "params": {"max_bpb_loss": 0.0}}
    d = _measured(exact).decide(_features(240))
    assert d.head == "262k" and d.code == "exact" and d.ladder == ()
    assert d.drafter == "32k+groups" and d.to_record()["drafter"] == "32k+groups"
    assert "verify" in d.reason
    # a drained reading does not draft; with every reading drained nothing does
    assert _measured(exact, "32k+groups").decide(_features(240)).drafter == "131k+groups"
    # a non-zero bound keeps the ladder; without measured readings there is no drafting
    d = _measured({"name": "lifecycle", "params": {"max_bpb_loss": 0.05}}).decide(
        _features(240))
    assert d.drafter is None
    predicted = Router(LADDERED, CPU, LiveState.for_profiles(LADDERED), exact)
    assert predicted.decide(_features(240)).drafter is None


def test_a_measured_readings_probes_and_prompt_measurement_are_priced() -> None:
    probed = dataclasses.replace(READING, probe_rows=262_144 / 8, measure_rows=262_144)
    plain = mixed_step_cost([Group(READING, 4, 100.0)], CPU)
    with_probes = mixed_step_cost([Group(probed, 4, 100.0)], CPU)
    # One shared read of an eighth of the native rows per step, whatever the batch.
    assert (with_probes.unembed_s - plain.unembed_s) * CPU.mem_bw == pytest.approx(
        262_144 / 8 * D * S)
    from router.cost import AnalyticTimer, prefill_s
    timer = AnalyticTimer(CPU)
    assert prefill_s(probed, timer, 100) - prefill_s(READING, timer, 100) >= \
        262_144 * D * S / CPU.mem_bw


def test_a_class_that_stays_put_starts_unmeasured_and_is_priced_without_it() -> None:
    lifecycle = {"name": "lifecycle", "params": {"max_bpb_loss": 0.05}}
    profiles = [dataclasses.replace(p, measure_rows=262_144.0) if p.reads else p
                for p in LADDERED]
    state = LiveState.for_profiles(profiles)
    router = Router(profiles, CPU, state, lifecycle, measured_readings=True)
    prose = _features(240)
    first = router.decide(prose)
    assert first.head == "32k+groups" and first.measure_prompt, first.reason
    penalty = first.request["heads"]["32k+groups"]["bpb_penalty"]
    state.ladders.add("32k+groups", "latin", penalty, {"32k+groups": 1500})
    assert router.decide(prose).measure_prompt  # 1500 bytes: too little evidence yet
    state.ladders.add("32k+groups", "latin", penalty, {"32k+groups": 1500})
    unmeasured = router.decide(prose)
    assert unmeasured.head == "32k+groups" and not unmeasured.measure_prompt
    assert unmeasured.to_record()["measure_prompt"] is False
    assert unmeasured.costs["32k+groups"] < first.costs["32k+groups"]  # no measurement
    # Another class of the same script has no evidence of its own: still measured
    assert router.decide(_features(205)).measure_prompt
    # Once this class's requests move up, it is measured again
    state.ladders.add("32k+groups", "latin", penalty, {"32k+groups": 100, "262k": 400})
    assert router.decide(prose).measure_prompt

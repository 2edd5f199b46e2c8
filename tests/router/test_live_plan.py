"""GET /admin/plan's planner: the optimum within the active quality bound beside the
unconstrained one, and every figure with its unit."""

from __future__ import annotations

import pytest

from kernels.devices import lookup_device
from router.cost import AnalyticTimer, train_cost_per_byte
from router.planner.live import live_plan_json
from router.planner.plan import UNITS
from router.profiles import HeadProfile, RequestFeatures

DEVICE = lookup_device("l4")
TRAINING_BYTES = 2.9e13  # Gemma-3-270M's: about 6T tokens at 4.8 bytes/token
HEADS = [HeadProfile(name, v, 640, 100_000_000, 36_864, 4, bytes_per_token=bpt,
                     training_bytes=TRAINING_BYTES)
         for name, v, bpt in (("32k", 32768, 4.32), ("131k", 131072, 4.79),
                              ("262k", 262144, 4.80))]


def request(penalty_32k: float) -> RequestFeatures:
    return RequestFeatures(400, 64, bpb_penalty={"32k": penalty_32k, "131k": 0.0, "262k": 0.0})


def plan(recent: list[RequestFeatures], bound: float | None, lam: float = 0.0) -> dict:
    return live_plan_json(HEADS, AnalyticTimer(DEVICE), [(f, 1) for f in recent], lam,
                          TRAINING_BYTES, 0.4, "lifecycle", bound)


def test_the_bound_moves_the_optimum_off_a_head_it_excludes() -> None:
    # English prompts the 32k head splits: predicted +30% BPB, past a 5% bound.
    doc = plan([request(0.3)] * 4, bound=0.05)
    assert doc["optimal_head"] == "32k"  # cheapest to train: the optimum at λ ≈ 0
    qb = doc["quality_bound"]
    assert qb == {"policy": "lifecycle", "max_bpb_loss": 0.05, "requests_judged": 4,
                  "optimal_vocab": 131072, "optimal_head": "131k",
                  "admits_every_judged_request": True}
    assert {c["head"]: c["within_bound_share"] for c in doc["candidates"]} == {
        "32k": 0.0, "131k": 1.0, "262k": 1.0}


def test_without_a_bound_or_a_judged_request_both_optima_agree() -> None:
    for recent, bound in (([request(0.3)], None), ([RequestFeatures(400, 64)], 0.05)):
        doc = plan(recent, bound)
        assert doc["quality_bound"]["optimal_head"] == doc["optimal_head"] == "32k"


def test_a_head_the_bound_admits_for_most_requests_wins_when_none_admits_all() -> None:
    heads = {"32k": 0.3, "131k": 0.2, "262k": 0.0}
    worse_262k = RequestFeatures(400, 64, bpb_penalty={**heads, "262k": 0.4, "32k": 0.0})
    doc = plan([RequestFeatures(400, 64, bpb_penalty=heads)] * 3 + [worse_262k], bound=0.05)
    assert doc["quality_bound"]["optimal_head"] == "262k"  # 3 of 4; the others 1 of 4
    assert doc["quality_bound"]["admits_every_judged_request"] is False


def test_every_figure_states_its_unit_and_device_hours_add_up() -> None:
    lam = 1e-3
    doc = plan([request(0.0)], bound=0.05, lam=lam)
    assert doc["device"] == "l4" and doc["training_bytes"] == TRAINING_BYTES
    units = doc["units"]
    for c in doc["candidates"]:
        for key, value in c.items():
            if isinstance(value, float) and key != "within_bound_share":
                assert key in UNITS, key
        assert "within_bound_share" in units
        assert c["lifecycle_device_hours"] == pytest.approx(
            c["train_device_hours"] + c["serve_device_hours"])
        head = next(h for h in HEADS if h.name == c["head"])
        # 6 FLOP per parameter per training token at 40% of peak, over the training bytes.
        train_s = train_cost_per_byte(head, DEVICE) / 0.4 * TRAINING_BYTES
        assert c["train_device_hours"] == pytest.approx(train_s / 3600)
        assert c["serve_device_hours"] == pytest.approx(
            lam * TRAINING_BYTES * c["infer_device_s_per_served_byte"] / 3600)
    for key in ("lambda", "mfu", "training_bytes", "max_bpb_loss", "batch"):
        assert key in units

"""Pricing a laddered head as its requests were served: byte shares per rung, shrunk per
content class, and the router's choice once a head's requests keep moving up."""

from __future__ import annotations

import pytest

from kernels.devices import DEVICES
from router.ladder_outcomes import (
    PRIOR_BYTES,
    LadderOutcomes,
    content_class,
    rung_shares,
    served_price,
)
from router.router import Router
from router.segmentation import PenaltyFit
from router.state import LiveState
from tests.router.helpers import english, heads


def test_content_class_is_the_script_and_the_penalty_half_octave() -> None:
    assert content_class("latin", None) == "latin~0"
    assert content_class("latin", 0.005) == "latin~0"
    assert content_class("latin", 0.13) == content_class("latin", 0.125) == "latin~7"
    assert content_class("latin", 0.44) == "latin~11"


def test_shares_start_on_the_head_and_shrink_towards_staying_put_per_class() -> None:
    outcomes = LadderOutcomes()
    assert rung_shares(outcomes.snapshot(), "32k", "latin", 0.4) == {"32k": 1.0}
    outcomes.add("32k", "latin", 0.44, {"262k": 512})  # moved at once, class latin~11
    shares = rung_shares(outcomes.snapshot(), "32k", "latin", 0.44)
    # 512 moved against a prior of 512 on 32k: half
    assert shares["32k"] == pytest.approx(0.5) and shares["262k"] == pytest.approx(0.5)
    # another class of the same script is not priced by it: it is tried on its own
    assert rung_shares(outcomes.snapshot(), "32k", "latin", 0.13) == {"32k": 1.0}
    for _ in range(20):
        outcomes.add("32k", "latin", 0.13, {"32k": 512})  # code stays on its start head
        outcomes.add("32k", "latin", 0.44, {"32k": 16, "262k": 496})  # German moves
    code = rung_shares(outcomes.snapshot(), "32k", "latin", 0.13)
    german = rung_shares(outcomes.snapshot(), "32k", "latin", 0.44)
    assert code == {"32k": 1.0} and german["32k"] < 0.1
    assert sum(german.values()) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        outcomes.add("32k", "latin", None, {"262k": -1})
    assert PRIOR_BYTES > 0


def test_served_price_blends_the_rungs_it_can_price() -> None:
    prices = {"a": 1.0, "b": 3.0}
    assert served_price("a", {"a": 0.5, "b": 0.5}, prices.get) == pytest.approx(2.0)
    assert served_price("a", {"a": 0.5, "gone": 0.5}, prices.get) == pytest.approx(1.0)
    assert served_price("gone", {"gone": 1.0}, prices.get) is None


def test_the_router_stops_choosing_a_head_whose_requests_all_move_up() -> None:
    profiles = heads()
    state = LiveState.for_profiles(profiles)
    doc = {"name": "cost", "params": {"max_bpb_loss": None}}
    router = Router(profiles, DEVICES["cpu"], state, doc,
                    quality_fit=PenaltyFit(per_split=1.0, per_fallback_share=2.0))
    first = router.decide(english())
    assert first.head == "32k"
    penalty = first.request["heads"]["32k"]["bpb_penalty"]
    for _ in range(8):  # each of them ended on the native head
        state.ladders.add("32k", "latin", penalty, {"32k": 16, "262k": 1000})
    moved = router.decide(english())
    assert moved.head != "32k"
    assert "bytes moved up the ladder, priced: 32k" in moved.reason

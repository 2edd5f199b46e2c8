"""Router head profiles from a manifest: which heads share rows for the nested pass."""

from __future__ import annotations

import dataclasses
import json

import pytest

from heads.errors import CheckpointError
from heads.manifest import AdapterSpec
from server.bootstrap import head_profiles
from tests.heads.tiny import tiny_manifest


def test_shared_rows_follow_the_matrix_and_the_adapter_kind() -> None:
    m = tiny_manifest()
    specs = {"400": AdapterSpec("hidden", 4, "adapters.400.", "a.safetensors"),
             "128": AdapterSpec("lowrank", 4, "adapters.128.", "a.safetensors")}
    m = dataclasses.replace(m, heads=tuple(dataclasses.replace(h, adapter=specs.get(h.name))
                                           for h in m.heads))
    local = {p.name: p.shared_rows for p in head_profiles(m)}
    assert local == {"1k": "matrices.shared", "400": "matrices.shared", "128": None}
    # The vLLM backend computes each head's logits on its own: no shared read to price.
    assert {p.shared_rows for p in head_profiles(m, nested_pass=False)} == {None}


def test_a_heads_fitted_penalty_travels_from_the_manifest_to_its_profile() -> None:
    from heads.manifest import Manifest, PenaltySpec

    m = tiny_manifest()
    fit = PenaltySpec(2.2, 0.4, 0.1, 14, ("en", "ru"), 0.08)
    old = PenaltySpec(2.2, 0.4, 0.1, 14, ("en", "ru"))  # stored before the prior existed
    m = m.with_penalties({"400": fit, "128": old})
    again = Manifest.from_dict(json.loads(m.to_json()))  # survives the JSON round trip
    assert again.penalty("400") == fit and again.penalty("1k") is None
    assert again.penalty("128").prior_split is None
    assert {p.name: p.bpb_penalty for p in head_profiles(again)} == {
        "1k": None, "400": (2.2, 0.4, 0.08), "128": (2.2, 0.4, 0.0)}
    raw = json.loads(m.to_json())
    raw["extra"]["bpb_penalty"]["400"]["per_split"] = -1.0
    with pytest.raises(CheckpointError, match="bpb_penalty"):
        Manifest.from_dict(raw)

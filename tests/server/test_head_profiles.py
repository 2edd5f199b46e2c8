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


def test_a_readings_profile_prices_its_split_heads_rows_plus_its_groups() -> None:
    from heads.manifest import Manifest, PenaltySpec
    from tests.heads.test_manifest import _split_manifest

    m = _split_manifest().with_penalties({"128+groups": PenaltySpec(1.5, 0.0, prior_split=0.1,
                                                                    group_rows=42.0)})
    m = Manifest.from_dict(json.loads(m.to_json()))  # as loaded from disk
    profiles = {p.name: p for p in head_profiles(m.with_readings(["128"]))}
    r = profiles["128+groups"]
    assert (r.vocab_size, r.reads, r.group_rows, r.bpb_penalty) == (128, "128", 42.0,
                                                                    (1.5, 0.0, 0.1))
    assert r.shared_rows == "matrices.shared" and r.bpt == profiles["1k"].bpt
    assert profiles["128"].group_rows == 0.0 and profiles["128"].reads is None


def test_the_vllm_backend_refuses_readings(tmp_path) -> None:
    from server.bootstrap import open_backend
    from server.settings import load_settings

    settings = load_settings(None, backend="vllm", grouped_heads=["32k"])
    with pytest.raises(CheckpointError, match="vLLM backend does not serve two-level"):
        open_backend(settings, tmp_path)

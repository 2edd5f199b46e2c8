"""Built-in models in the cache: a demo built by an older polyhead is rebuilt, not served."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from server import model_source
from server.model_source import DEMO, DEMO_BUILD, resolve_model_dir


def _fake_demo(cache: Path, build: int | None) -> Path:
    target = cache / "models" / f"{DEMO}-heads"
    target.mkdir(parents=True)
    extra = {} if build is None else {"demo_build": build}
    (target / "manifest.json").write_text(json.dumps({"extra": extra}))
    return target


def _current_demo(cache: Path, m: Any, fit: Any) -> Path:
    """A demo of the current build whose every head carries `fit`."""
    target = cache / "models" / f"{DEMO}-heads"
    target.mkdir(parents=True)
    m = dataclasses.replace(m, extra={**m.extra, "demo_build": DEMO_BUILD})
    m.with_penalties({h.name: fit for h in m.heads}).save(target)
    return target


@pytest.mark.parametrize("build", [None, DEMO_BUILD - 1])
def test_a_stale_demo_is_rebuilt(tmp_path: Path, monkeypatch, build: int | None) -> None:
    target = _fake_demo(tmp_path, build)
    built: list[Path] = []

    def fake_build(t: Path, cache_dir: Path) -> None:  # the real one downloads 238 MB
        assert not t.exists()  # the stale directory was removed first
        t.mkdir(parents=True)
        (t / "manifest.json").write_text(json.dumps({"extra": {"demo_build": DEMO_BUILD}}))
        built.append(t)

    monkeypatch.setattr(model_source, "_build_demo", fake_build)
    assert resolve_model_dir(DEMO, tmp_path) == target
    assert built == [target]
    assert resolve_model_dir(DEMO, tmp_path) == target and built == [target]  # now current


def test_a_current_demo_is_served_as_is(tmp_path: Path, monkeypatch) -> None:
    target = _fake_demo(tmp_path, DEMO_BUILD)
    monkeypatch.setattr(model_source, "_build_demo", lambda *a: pytest.fail("rebuilt"))
    assert resolve_model_dir(DEMO, tmp_path) == target


def test_a_current_demo_fitted_without_the_prior_is_refitted_from_its_stored_evaluation(
        tmp_path: Path, monkeypatch) -> None:
    from heads.manifest import Manifest, PenaltySpec
    from tests.heads.tiny import tiny_manifest

    m = tiny_manifest()
    target = _current_demo(tmp_path, m, PenaltySpec(1.0, 0.0))
    vocab = {h.name: h.vocab_size for h in m.heads}
    native = max(vocab, key=vocab.__getitem__)
    small = min(vocab, key=vocab.__getitem__)
    table = {lang: {native: {"bytes_per_token": 4.0, "bpb": 1.0},
                    small: {"bytes_per_token": bpt, "bpb": 1.0 + 3.0 * (1 - bpt / 4.0)}}
             for lang, bpt in (("en", 3.6), ("ru", 2.0))}
    (target / model_source.PENALTY_EVAL_DIR).mkdir()
    (target / model_source.PENALTY_EVAL_DIR / "eval-by-source.json").write_text(json.dumps(table))
    monkeypatch.setattr(model_source, "fit_penalties", lambda *a, **k: pytest.fail("re-ran"))
    assert resolve_model_dir(DEMO, tmp_path) == target
    fit = Manifest.load(target).penalty(small)
    assert fit is not None and fit.prior_split == pytest.approx(0.1)  # en: 1 - 3.6 / 4
    assert fit.per_split == pytest.approx(3.0)
    assert Manifest.load(target).penalty(native).prior_split == 0.0


def test_a_two_level_reading_is_fitted_on_its_split_heads_share_with_its_row_reads(
        tmp_path: Path, monkeypatch) -> None:
    from heads.manifest import Manifest, PenaltySpec
    from tests.heads.test_manifest import _split_manifest

    m = _split_manifest()
    target = _current_demo(tmp_path, m, PenaltySpec(1.0, 0.0, prior_split=0.0))
    table = {lang: {"1k": {"bytes_per_token": 4.0, "bpb": 1.0, "tokens": tokens},
                    "400": {"bytes_per_token": 3.9, "bpb": 1.01, "tokens": tokens},
                    "128": {"bytes_per_token": bpt, "bpb": 1.0 + 3.0 * (1 - bpt / 4.0),
                            "tokens": tokens},
                    "128+groups": {"bytes_per_token": 4.0, "bpb": 1.0 + (1 - bpt / 4.0),
                                   "tokens": tokens, "group_rows_per_token": rows},
                    "400+groups": {"bytes_per_token": 4.0, "bpb": 1.0, "tokens": tokens}}
             for lang, bpt, tokens, rows in (("en", 3.6, 300, 10.0), ("ru", 2.0, 100, 50.0))}
    (target / model_source.PENALTY_EVAL_DIR).mkdir()
    path = target / model_source.PENALTY_EVAL_DIR / "eval-by-source.json"
    # An evaluation from before readings were scored is run again, with them.
    old = {lang: {h: v for h, v in row.items() if "+" not in h} for lang, row in table.items()}
    path.write_text(json.dumps(old))
    ran: list[Path] = []

    def fake_fit(t: Path, *a: object, **k: object) -> dict:
        ran.append(t)
        return model_source.store_penalties(t, table)

    monkeypatch.setattr(model_source, "fit_penalties", fake_fit)
    assert resolve_model_dir(DEMO, tmp_path) == target and ran == [target]
    fit = Manifest.load(target).penalty("128+groups")
    assert fit is not None and fit.per_split == pytest.approx(1.0)  # on 128's split share
    assert fit.prior_split == pytest.approx(0.1)
    assert fit.group_rows == pytest.approx((300 * 10 + 100 * 50) / 400)
    assert Manifest.load(target).penalty("128").group_rows is None
    path.write_text(json.dumps(table))  # now kept: the next start reads it, runs nothing
    model_source.refit_penalties(target)
    assert ran == [target]

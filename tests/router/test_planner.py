"""The lifecycle planner: forecast validation, closed-form break-even λ, Table VI, the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from router.errors import InvalidForecast
from router.planner import parse_forecast, plan
from router.planner.plan import Line, break_even, plan_json
from router.profiles import estimate_bytes_per_token
from server.cli import main
from tests.router.test_lifecycle_table import BATCHES, LAMBDAS, table

ROOT = Path(__file__).resolve().parents[2]
FORECASTS = ROOT / "deploy" / "forecasts"


def doc(**over: object) -> dict:
    base: dict = {
        "device": "a10g",
        "backbone": {"hidden_size": 2048, "backbone_params": "1.2e9", "layers": 24},
        "vocab": [{"size": 32768, "bytes_per_token": 3.9}, 131072,
                  {"size": 262144, "bytes_per_token": 4.6}],
        "volume": {"lambda": 10},
        "regimes": [{"name": "dc", "share": 0.9, "batch": 256, "prompt_bytes": 2000,
                     "output_tokens": 256},
                    {"name": "edge", "share": 0.1, "batch": 1, "prompt_bytes": 500,
                     "output_bytes": 1000}],
    }
    base.update(over)
    return base


def test_break_even_closed_form() -> None:
    base = Line(32768, train=1.0, infer=2.0)
    assert break_even(Line(1, train=3.0, infer=1.0), base) == pytest.approx(2.0)
    assert break_even(Line(2, train=3.0, infer=2.0), base) == math.inf
    assert break_even(Line(3, train=1.0, infer=1.5), base) == 0.0
    line = Line(4, train=3.0, infer=1.0)
    lam = break_even(line, base)
    assert line.at(lam) == pytest.approx(base.at(lam))


def test_paper_forecast_reproduces_table_vi_rows() -> None:
    f = parse_forecast(yaml.safe_load((FORECASTS / "paper-table-vi.yaml").read_text()))
    p = plan(f)
    want = table("a10g", 1.2e9, {c.vocab_size: c.bytes_per_token for c in f.candidates})
    assert tuple(r.batch for r in f.regimes) == BATCHES and f.sweep == LAMBDAS
    got = {r.batch: tuple(s.optimal_at(lam).vocab_size // 1024 for lam in LAMBDAS)
           for r, s in zip(f.regimes, p.regimes, strict=True)}
    assert got == want


def test_mix_is_share_weighted_and_break_even_is_where_lines_cross() -> None:
    p = plan(parse_forecast(doc()))
    for j, line in enumerate(p.mix.lines):
        assert line.infer == pytest.approx(sum(s.share * s.lines[j].infer for s in p.regimes))
    base = p.mix.train_optimal
    for line in p.mix.lines:
        lam = p.mix.break_evens()[line.vocab_size]
        if 0 < lam < math.inf:
            assert line.at(lam) == pytest.approx(base.at(lam))
            assert line.at(lam * 1.01) < base.at(lam * 1.01)
    env = p.mix.envelope()
    assert env[0][0] == 0 and env[-1][1] == math.inf
    assert env[0][2] == base.vocab_size
    assert any(v == p.mix.optimal.vocab_size and a <= 10 < b for a, b, v in env)


def test_bytes_per_token_fit_and_estimate() -> None:
    f = parse_forecast(doc())
    bpt = {c.vocab_size: (c.bytes_per_token, c.source) for c in f.candidates}
    assert bpt[131072][1] == "fit"
    # Two points, log-linear: 131k sits 2/3 of the way from 32k to 262k in ln V.
    assert bpt[131072][0] == pytest.approx(3.9 + (4.6 - 3.9) * 2 / 3)
    f = parse_forecast(doc(vocab=[8192, 65536]))
    assert [(c.bytes_per_token, c.source) for c in f.candidates] == [
        (estimate_bytes_per_token(8192), "estimate"), (estimate_bytes_per_token(65536), "estimate")]


def test_inference_bytes_volume_and_explicit_device() -> None:
    f = parse_forecast(doc(volume={"inference_bytes": "2e12"}, training={"bytes": "1e11"},
                           device={"name": "mine", "peak_flops": 1e14, "mem_bw": 1e12}))
    assert f.lam == pytest.approx(20) and f.device.ridge_point == pytest.approx(100)


@pytest.mark.parametrize(("over", "field"), [
    ({"regimes": [{"share": 0.9, "batch": 1, "prompt_bytes": 1, "output_tokens": 1},
                  {"share": 1.5, "batch": 1, "prompt_bytes": 1, "output_tokens": 1}]},
     "regimes[1].share"),
    ({"regimes": [{"share": 0.5, "batch": 1, "prompt_bytes": 1, "output_tokens": 1}]},
     "regimes"),
    ({"regimes": [{"share": 1, "batch": 0, "prompt_bytes": 1, "output_tokens": 1}]},
     "regimes[0].batch"),
    ({"regimes": [{"share": 1, "batch": 1, "prompt_bytes": 1}]}, "regimes[0]"),
    ({"device": "tpu9"}, "device"),
    ({"device": {"peak_flops": 1e14}}, "device.mem_bw"),
    ({"backbone": {"hidden_size": 2048, "layers": 24}}, "backbone.backbone_params"),
    ({"vocab": [32768, {"size": "big"}]}, "vocab[1].size"),
    ({"vocab": [32768, 32768]}, "vocab[1].size"),
    ({"vocab": []}, "vocab"),
    ({"volume": {"inference_bytes": 1e12}}, "training.bytes"),
    ({"volume": {}}, "volume"),
    ({"training": {"mfu": 2}}, "training.mfu"),
    ({"sweep": [1, -1]}, "sweep[1]"),
    ({"colour": "red"}, "colour"),
])
def test_bad_forecast_names_the_field(over: dict, field: str) -> None:
    with pytest.raises(InvalidForecast) as e:
        parse_forecast(doc(**over))
    assert e.value.field == field and str(e.value).startswith(f"{field}: ")


def test_share_error_message() -> None:
    bad = doc()
    bad["regimes"][1]["share"] = 0
    with pytest.raises(InvalidForecast, match=r"^regimes\[1\]\.share: must be in \(0, 1\]"):
        parse_forecast(bad)


@pytest.mark.parametrize("name", ["edge", "datacenter", "paper-table-vi"])
def test_cli_plan_examples(name: str, tmp_path: Path, capsys) -> None:
    assert main(["plan", str(FORECASTS / f"{name}.yaml"), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "optimal V =" in out and "break-even λ" in out
    data = json.loads((tmp_path / f"plan-{name}.json").read_text())
    assert data["mix"]["optimal_vocab"] in {c["vocab_size"] for c in data["candidates"]}
    assert (tmp_path / f"plan-{name}.png").stat().st_size > 0
    assert plan_json(plan(parse_forecast(yaml.safe_load(
        (FORECASTS / f"{name}.yaml").read_text())))) == data


def test_cli_bad_forecast_exits_2(tmp_path: Path, capsys) -> None:
    bad = doc()
    bad["regimes"][1]["share"] = 1.5
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    assert main(["plan", str(path), "--out", str(tmp_path), "--no-plot"]) == 2
    assert "regimes[1].share: must be in (0, 1]" in capsys.readouterr().err
    path.write_text("regimes: [unclosed")
    assert main(["plan", str(path), "--out", str(tmp_path)]) == 2
    assert "not valid YAML" in capsys.readouterr().err

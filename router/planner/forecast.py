"""A deployment forecast, validated from a plain mapping (the CLI parses the YAML).

Every error names its field (`regimes[1].share: must be in (0, 1]`). Shares are fractions of
served bytes; they must sum to 1. Numbers may be strings such as "1.2e9" (YAML 1.1 reads
exponents without a dot as strings).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kernels.devices import DEVICES, DeviceSpec
from router.errors import InvalidForecast
from router.planner.bpt import extrapolate, fit_log_linear

log = logging.getLogger(__name__)

_TOP = {"name", "device", "backbone", "vocab", "training", "volume", "regimes", "sweep"}


@dataclass(frozen=True, slots=True)
class Regime:
    name: str
    share: float  # fraction of served bytes
    batch: int  # live decode batch B
    prompt_bytes: int
    output_tokens: int | None  # in the serving head's tokens (the paper's max_tokens) ...
    output_bytes: int | None  # ... or in bytes, converted per head


@dataclass(frozen=True, slots=True)
class Backbone:
    hidden_size: int  # d
    backbone_params: int  # N, transformer layers only
    layers: int
    kv_bytes_per_token: float  # all layers
    weight_bytes_per_param: float


@dataclass(frozen=True, slots=True)
class Candidate:
    vocab_size: int
    bytes_per_token: float
    source: str  # "given", "fit" (log-linear through the given points) or "estimate"


@dataclass(frozen=True, slots=True)
class Forecast:
    name: str
    device: DeviceSpec
    backbone: Backbone
    candidates: tuple[Candidate, ...]
    regimes: tuple[Regime, ...]
    lam: float  # served bytes ÷ training bytes
    training_bytes: float | None
    mfu: float  # training model-FLOP utilisation; 1.0 is the peak-FLOP floor
    sweep: tuple[float, ...]  # λ values for the optimal-V grid


def _num(doc: Mapping[str, Any], key: str, path: str, *, default: Any = ...,
         positive: bool = True, integer: bool = False) -> Any:
    field = f"{path}.{key}" if path else key
    if key not in doc or doc[key] is None:
        if default is ...:
            raise InvalidForecast(field, "is required")
        return default
    raw = doc[key]
    try:
        if isinstance(raw, bool):
            raise ValueError
        value = float(raw)
    except (TypeError, ValueError):
        raise InvalidForecast(field, f"must be a number, got {raw!r}") from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise InvalidForecast(field, f"must be {'> 0' if positive else '>= 0'}, got {raw!r}")
    if integer:
        if value != int(value):
            raise InvalidForecast(field, f"must be an integer, got {raw!r}")
        return int(value)
    return value


def _map(doc: Any, field: str, known: set[str] | None = None) -> Mapping[str, Any]:
    if not isinstance(doc, Mapping):
        raise InvalidForecast(field or "forecast", "must be a mapping")
    if known is not None:
        extra = sorted(set(map(str, doc)) - known)
        if extra:
            where = f"{field}.{extra[0]}" if field else extra[0]
            raise InvalidForecast(where, f"unknown field (known: {', '.join(sorted(known))})")
    return doc


def _device(raw: Any) -> DeviceSpec:
    if isinstance(raw, str):
        if raw not in DEVICES:
            raise InvalidForecast("device", f"unknown device {raw!r} (known: {', '.join(DEVICES)})")
        return DEVICES[raw]
    doc = _map(raw, "device", {"name", "peak_flops", "mem_bw", "launch_overhead_s"})
    return DeviceSpec(str(doc.get("name", "custom")), _num(doc, "peak_flops", "device"),
                      _num(doc, "mem_bw", "device"),
                      _num(doc, "launch_overhead_s", "device", default=0.0, positive=False))


def _backbone(raw: Any) -> Backbone:
    doc = _map(raw, "backbone", {"hidden_size", "backbone_params", "layers", "kv_dim",
                                 "kv_bytes_per_token", "weight_bytes_per_param"})
    d = _num(doc, "hidden_size", "backbone", integer=True)
    layers = _num(doc, "layers", "backbone", integer=True)
    s = _num(doc, "weight_bytes_per_param", "backbone", default=2.0)
    # K and V, each kv_dim wide (d for full multi-head attention, less with GQA), per layer.
    kv_dim = _num(doc, "kv_dim", "backbone", default=d, integer=True)
    kv = _num(doc, "kv_bytes_per_token", "backbone", default=2 * layers * kv_dim * s)
    return Backbone(d, _num(doc, "backbone_params", "backbone", integer=True), layers, kv, s)


def _candidates(raw: Any) -> tuple[Candidate, ...]:
    if not isinstance(raw, Sequence) or isinstance(raw, str) or not raw:
        raise InvalidForecast("vocab",
                              "must be a non-empty list of sizes or {size, bytes_per_token}")
    given: list[tuple[int, float | None]] = []
    for i, item in enumerate(raw):
        field = f"vocab[{i}]"
        doc = _map(item if isinstance(item, Mapping) else {"size": item}, field,
                   {"size", "bytes_per_token"})
        size = _num(doc, "size", field, integer=True)
        if any(v == size for v, _ in given):
            raise InvalidForecast(f"{field}.size", f"duplicate vocabulary size {size}")
        given.append((size, _num(doc, "bytes_per_token", field, default=None)))
    points = [(v, b) for v, b in given if b is not None]
    fit = fit_log_linear(points)
    kind = "fit" if points else "estimate"
    return tuple(Candidate(v, b, "given") if b is not None
                 else Candidate(v, extrapolate(v, fit), kind) for v, b in given)


def _regimes(raw: Any) -> tuple[Regime, ...]:
    if not isinstance(raw, Sequence) or isinstance(raw, str) or not raw:
        raise InvalidForecast("regimes", "must be a non-empty list")
    out = []
    for i, item in enumerate(raw):
        field = f"regimes[{i}]"
        doc = _map(item, field, {"name", "share", "batch", "prompt_bytes", "output_tokens",
                                 "output_bytes"})
        share = _num(doc, "share", field, positive=False)
        if not 0 < share <= 1:
            raise InvalidForecast(f"{field}.share", f"must be in (0, 1], got {doc['share']!r}")
        out_tok = _num(doc, "output_tokens", field, default=None, positive=False, integer=True)
        out_b = _num(doc, "output_bytes", field, default=None, positive=False, integer=True)
        if (out_tok is None) == (out_b is None):
            raise InvalidForecast(field, "give exactly one of output_tokens, output_bytes")
        out.append(Regime(str(doc.get("name", f"regime{i}")), share,
                          _num(doc, "batch", field, integer=True),
                          _num(doc, "prompt_bytes", field, positive=False, integer=True),
                          out_tok, out_b))
    total = sum(r.share for r in out)
    if abs(total - 1.0) > 1e-6:
        raise InvalidForecast("regimes", f"shares must sum to 1, got {total:g}")
    return tuple(out)


def _volume(doc: Mapping[str, Any], training_bytes: float | None) -> float:
    vol = _map(doc.get("volume"), "volume", {"lambda", "inference_bytes"})
    if ("lambda" in vol) == ("inference_bytes" in vol):
        raise InvalidForecast("volume", "give exactly one of lambda, inference_bytes")
    if "lambda" in vol:
        return float(_num(vol, "lambda", "volume", positive=False))
    if training_bytes is None:
        raise InvalidForecast("training.bytes", "is required when volume is inference_bytes")
    return float(_num(vol, "inference_bytes", "volume", positive=False)) / training_bytes


def parse_forecast(doc: Any) -> Forecast:
    top = _map(doc, "", _TOP)
    for key in ("device", "backbone", "vocab", "volume", "regimes"):
        if key not in top:
            raise InvalidForecast(key, "is required")
    train = _map(top.get("training", {}), "training", {"bytes", "mfu"})
    training_bytes = _num(train, "bytes", "training", default=None)
    mfu = _num(train, "mfu", "training", default=1.0)
    if mfu > 1:
        raise InvalidForecast("training.mfu", f"must be in (0, 1], got {train['mfu']!r}")
    sweep_raw = top.get("sweep", [])
    if not isinstance(sweep_raw, Sequence) or isinstance(sweep_raw, str):
        raise InvalidForecast("sweep", "must be a list of λ values")
    sweep = tuple(_num({f'sweep[{i}]': v}, f'sweep[{i}]', '', positive=False)
                  for i, v in enumerate(sweep_raw))
    return Forecast(
        name=str(top.get("name", "forecast")), device=_device(top["device"]),
        backbone=_backbone(top["backbone"]), candidates=_candidates(top["vocab"]),
        regimes=_regimes(top["regimes"]), lam=_volume(top, training_bytes),
        training_bytes=training_bytes, mfu=mfu, sweep=sweep,
    )


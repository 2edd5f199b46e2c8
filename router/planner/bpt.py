"""Bytes/token for candidate vocabularies that were not measured.

bpt(V) = A·ln V + B, least squares through the given (V, bytes/token) points. One point:
the documented slope of router.profiles through that point. None: the documented estimate.
Never below 1 byte/token (byte-fallback tokens cover one byte each).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from router.profiles import BPT_LOG_SLOPE, estimate_bytes_per_token


def fit_log_linear(points: Sequence[tuple[int, float]]) -> tuple[float, float] | None:
    """(A, B) of bpt = A·ln V + B, or None when there are no points to fit."""
    if not points:
        return None
    xs = [math.log(v) for v, _ in points]
    ys = [b for _, b in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    a = BPT_LOG_SLOPE if sxx == 0 else sum(
        (x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return a, my - a * mx


def extrapolate(vocab_size: int, fit: tuple[float, float] | None) -> float:
    if fit is None:
        return estimate_bytes_per_token(vocab_size)
    a, b = fit
    return max(1.0, a * math.log(vocab_size) + b)

"""Prefill pricing (router.prefill_time_fit): analytic until measured, then the fit of the
engine's prefill steps, with a reading's prompt measurement fitted on its own column."""

from __future__ import annotations

import dataclasses

import pytest

from kernels.devices import DEVICES
from router.cost import AnalyticTimer, measured_positions, prefill_cost, prefill_s
from router.nonneg_fit import fit_nonneg
from router.prefill_time_fit import MIN_FIT_SAMPLES, FittedPrefillTime, PrefillSample
from router.step_time_fit import FittedStepTimer
from tests.router.helpers import heads

CPU = DEVICES["cpu"]


def _measured(h):  # a reading whose prompts the engine measures against a 262k native head
    return dataclasses.replace(h, name=f"{h.name}+groups", measure_rows=262_144.0,
                               measure_positions=64)


def _true_s(head, tokens: int, measured: int) -> float:
    # 8 ms of host time, the backbone at 40% of peak, the measurement at 70% of its analytic
    # time, the unembedding read at nominal bandwidth.
    c = prefill_cost(head, CPU, tokens, measured)
    return 8e-3 + c.memory_s + 2.5 * c.compute_s + 1 / 0.7 * c.measure_s


def test_the_nonneg_fit_recovers_coefficients_and_never_goes_negative() -> None:
    rows = [((x, y), 0.5 + 2.0 * x + 3.0 * y) for x in (1.0, 2.0, 5.0) for y in (0.5, 4.0)]
    (c0, a, b), err = fit_nonneg(rows)
    assert (c0, a, b) == pytest.approx((0.5, 2.0, 3.0), rel=1e-6) and err < 1e-9
    # t falls with x: the unconstrained slope is negative, so x's coefficient is held at 0
    falling = [((x, 0.0), 10.0 - x) for x in (1.0, 2.0, 3.0, 4.0)]
    coef, _ = fit_nonneg(falling)
    assert min(coef) >= 0 and coef[1] == 0.0
    assert fit_nonneg([]) is None


def test_prefill_is_analytic_until_measured_then_fitted_per_resource() -> None:
    small, plain = heads()[:2]  # two widths, so the read and the overhead separate
    reading = _measured(plain)
    timer = FittedPrefillTime(CPU, [small, plain, reading])
    assert timer.seconds(reading, 100, 50) == prefill_cost(reading, CPU, 100, 50).analytic_s
    for tokens in (5, 24, 60, 150, 400):
        for h in (small, plain):
            timer.record(PrefillSample(((h.name, tokens, 0),), _true_s(h, tokens, 0)))
        k = measured_positions(reading, tokens)
        timer.record(PrefillSample(((reading.name, tokens, k),), _true_s(reading, tokens, k)))
    assert timer.fit is not None and timer.fit.samples == 15 >= MIN_FIT_SAMPLES
    assert timer.fit.overhead_s == pytest.approx(8e-3, rel=1e-3)
    assert timer.fit.cmp_scale == pytest.approx(2.5, rel=1e-3)
    assert timer.fit.measure_scale == pytest.approx(1 / 0.7, rel=1e-3)
    # A length never measured, on either head
    assert timer.seconds(reading, 1000, 64) == pytest.approx(_true_s(reading, 1000, 64),
                                                             rel=1e-3)
    assert timer.seconds(plain, 1000, 0) == pytest.approx(_true_s(plain, 1000, 0), rel=1e-3)


def test_a_measurement_never_seen_is_priced_at_its_analytic_time() -> None:
    plain = heads()[1]
    reading = _measured(plain)
    timer = FittedPrefillTime(CPU, [plain, reading])
    for tokens in range(10, 10 + 10 * MIN_FIT_SAMPLES, 10):  # unmeasured prompts only
        timer.record(PrefillSample(((plain.name, tokens, 0),), _true_s(plain, tokens, 0)))
    cost = prefill_cost(reading, CPU, 200, 64)
    unmeasured = timer.seconds(plain, 200, 0)
    assert timer.seconds(reading, 200, 64) == pytest.approx(unmeasured + cost.measure_s)


def test_a_slow_first_prefill_moves_the_fit_as_if_at_most_twice_off() -> None:
    plain = heads()[1]
    timer = FittedPrefillTime(CPU, [plain])
    for tokens in range(10, 10 + 10 * MIN_FIT_SAMPLES, 10):
        timer.record(PrefillSample(((plain.name, tokens, 0),), _true_s(plain, tokens, 0)))
    before = timer.seconds(plain, 157, 0)
    timer.record(PrefillSample(((plain.name, 157, 0),), 40 * before))  # a cold shape
    assert timer.seconds(plain, 157, 0) < 1.3 * before


def test_the_router_prices_a_prompt_as_the_fitted_timer_says() -> None:
    small, plain = heads()[:2]
    reading = _measured(plain)
    analytic, fitted = AnalyticTimer(CPU), FittedStepTimer(CPU, [small, plain, reading])
    assert prefill_s(reading, analytic, 100) == prefill_cost(reading, CPU, 100, 50).analytic_s
    for tokens in (5, 24, 60, 150, 400):
        k = measured_positions(reading, tokens)
        for h, m in ((small, 0), (plain, 0), (reading, k)):
            fitted.prefill.record(PrefillSample(((h.name, tokens, m),), _true_s(h, tokens, m)))
    assert prefill_s(reading, fitted, 100) == pytest.approx(_true_s(reading, 100, 50), rel=1e-3)
    assert prefill_s(plain, fitted, 100) == pytest.approx(_true_s(plain, 100, 0), rel=1e-3)


def test_measured_positions_follow_the_engine() -> None:
    reading = dataclasses.replace(_measured(heads()[1]), measure_positions=16)
    assert measured_positions(reading, 8) == 0  # 7 predicted positions: below the minimum
    assert measured_positions(reading, 9) == 4  # the later half of 8
    assert measured_positions(reading, 25) == 12
    assert measured_positions(reading, 500) == 16  # capped at measure_positions
    assert measured_positions(heads()[1], 500) == 0  # an unmeasured head

"""Non-negative relative least squares: measured times explained by analytic resource times.

A measured time t is modelled as c0 + Σ c_i · x_i, where the x_i are the analytic seconds of
each resource the step used (router.cost) and c_i ≥ 0 the factor the machine is off them by
(1 / c_i is the achieved fraction of peak), c0 ≥ 0 a fixed overhead. Rows are divided by t,
so a 10 µs step counts as much as a 10 ms one. The decode and prefill timers both fit this.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting on an n×n system; None when singular."""
    n = len(b)
    m = [row[:] + [rhs] for row, rhs in zip(a, b, strict=True)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-30:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col], strict=True)]
    return [m[i][n] / m[i][i] for i in range(n)]


def fit_nonneg(samples: Sequence[tuple[tuple[float, ...], float]]
               ) -> tuple[tuple[float, ...], float] | None:
    """samples: (resource seconds x_1..x_n, measured seconds t) -> ((c0, c_1..c_n), RMS
    relative error), the best fit with every coefficient ≥ 0; None with no samples.

    Non-negative by enumeration: the unconstrained solution of each subset of coefficients
    (the rest held at 0), the best one with no negative coefficient. Clamping the full
    solution's negatives instead left the others fitted to a column that was gone (a 1.5 s
    "overhead" and 330x relative error, measured on the decode fit)."""
    if not samples:
        return None
    n = 1 + len(samples[0][0])
    ata = [[0.0] * n for _ in range(n)]
    atb = [0.0] * n
    for xs, t in samples:
        row = (1.0 / t, *(x / t for x in xs))
        for i in range(n):
            atb[i] += row[i]
            for j in range(n):
                ata[i][j] += row[i] * row[j]
    for i in range(n):  # a touch of ridge: shapes that never vary leave a column flat
        ata[i][i] += 1e-9 * (ata[i][i] or 1.0)
    best: tuple[tuple[float, ...], float] | None = None
    subsets = (keep for size in range(n, 0, -1)
               for keep in itertools.combinations(range(n), size))
    for keep in subsets:
        sub = _solve([[ata[i][j] for j in keep] for i in keep], [atb[i] for i in keep])
        if sub is None or min(sub) < 0:
            continue
        coef = [0.0] * n
        for i, c in zip(keep, sub, strict=True):
            coef[i] = c
        err = math.sqrt(sum(((coef[0] + sum(c * x for c, x in zip(coef[1:], xs, strict=True)))
                             / t - 1.0) ** 2 for xs, t in samples) / len(samples))
        if best is None or err < best[1]:
            best = (tuple(coef), err)
    return best

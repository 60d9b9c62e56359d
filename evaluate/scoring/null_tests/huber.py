"""huber: a robust prediction p-value on log Abar that one outlying clean model cannot move
(the recommended test).

The null models' log Abars get Huber's proposal 2 location m and scale s (Huber 1964; the joint
M-estimate of statsmodels' ``robust.scale.Huber``, c = 1.5: values further than 1.5 s from m count
as if they were at 1.5 s), and a model's statistic is (log Abar - m) / s. Its null distribution
depends only on k, since m and s move with the data's location and scale: it is measured once per
k by a seeded simulation of normal nulls (``REFERENCE_DRAWS`` draws), and the p-value is the
statistic's rank among those draws, (1 + #{simulated >= t}) / (draws + 1), exact under a normal
null up to simulation error of about 1 / sqrt(draws).

Why this test: the Student-t test's mean and SD are moved without bound by one clean model far
from the others (a held-out reference that trained badly); with 10 nulls, one at 5 SD widens the
fit enough that a model must lie 5.06 SD out to be detected with power 0.8, against 2.83 SD on a
clean null. Huber's fit caps each value's pull: on the same contaminated null it needs 3.62 SD,
on a clean one 2.88, and with 20 nulls 2.66 against the Student-t test's 2.64
(``evaluate/benchmarks/null_tests.py`` measures them).
"""
from __future__ import annotations

import functools

import numpy as np
from scipy.stats import norm

from counteraudit.evaluate.scoring.null_tests.base import NULL_TESTS, NullTest, check_nulls

TUNING = 1.5  # statsmodels' default: 95% efficiency for a normal location
CONSISTENCY = (2 * norm.cdf(TUNING) - 1) * (1 - TUNING ** 2) + TUNING ** 2 \
    - 2 * TUNING * norm.pdf(TUNING)  # E[psi(Z)^2] for a standard normal Z: makes s estimate the SD
MAD_TO_SD = 1 / norm.ppf(0.75)
TOLERANCE = 1e-8
MAX_ITERATIONS = 500
REFERENCE_DRAWS = 200_000
REFERENCE_SEED = 20241127


def huber_location_scale(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Huber's proposal 2 location and scale of ``values`` (..., k) along the last axis: the
    iteration of statsmodels' ``robust.scale.Huber`` (Venables & Ripley, section 5.5), from the
    median and the normalised MAD, run row by row until each row's change is below ``TOLERANCE``
    times its scale. A sample whose MAD is 0 (over half its values equal) starts from its SD; a
    constant sample has scale 0."""
    values = np.asarray(values, dtype=np.float64)
    k = values.shape[-1]
    location = np.median(values, axis=-1, keepdims=True)
    scale = MAD_TO_SD * np.median(np.abs(values - location), axis=-1, keepdims=True)
    scale = np.where(scale > 0, scale, values.std(axis=-1, ddof=1, keepdims=True))
    active = np.broadcast_to(scale > 0, location.shape).copy()
    for _ in range(MAX_ITERATIONS):
        if not active.any():
            break
        rows = values[active[..., 0]]
        m, s = location[active][:, None], scale[active][:, None]
        new_m = np.clip(rows, m - TUNING * s, m + TUNING * s).mean(axis=-1, keepdims=True)
        inside = np.abs(rows - m) <= TUNING * s
        new_s = np.sqrt(np.where(inside, (rows - new_m) ** 2, (TUNING * s) ** 2).sum(
            axis=-1, keepdims=True) / ((k - 1) * CONSISTENCY))
        settled = (np.abs(s - new_s) <= TOLERANCE * new_s) & (np.abs(m - new_m) <= TOLERANCE * new_s)
        location[active], scale[active] = new_m[:, 0], new_s[:, 0]
        still = active.copy()
        still[active] = ~settled[:, 0]
        active = still
    return location[..., 0], scale[..., 0]


def _statistic(null_logs: np.ndarray, logs: np.ndarray) -> np.ndarray:
    location, scale = huber_location_scale(null_logs)
    with np.errstate(divide="ignore", invalid="ignore"):
        statistic = (logs - location[..., None]) / scale[..., None]
    # equal nulls (scale 0): any model above them is infinitely far out, one at their value not
    return np.where(np.isnan(statistic), 0.0, statistic)


@functools.cache
def reference_statistics(k: int) -> np.ndarray:
    """The statistic of a new clean model against k clean models, for ``REFERENCE_DRAWS``
    seeded draws of a standard normal null, sorted: the distribution p-values are read from."""
    rng = np.random.default_rng([REFERENCE_SEED, k])
    nulls = rng.standard_normal((REFERENCE_DRAWS, k))
    candidates = rng.standard_normal((REFERENCE_DRAWS, 1))
    return np.sort(_statistic(nulls, candidates)[:, 0])


@NULL_TESTS.register
class Huber(NullTest):
    name = "huber"
    min_nulls = 5  # with fewer, one outlying null is a large part of the sample
    summary = ("Huber's robust location and scale of log Abar, which one outlying null cannot "
               "move, calibrated by simulation")

    def p_values(self, null_abars: np.ndarray, abars: np.ndarray) -> np.ndarray:
        null_logs = np.log(check_nulls(null_abars, self.min_nulls))
        reference = reference_statistics(null_logs.shape[-1])
        statistic = _statistic(null_logs, np.log(np.asarray(abars, dtype=np.float64)))
        at_least = len(reference) - np.searchsorted(reference, statistic, side="left")
        return (1 + at_least) / (len(reference) + 1)

    def location_scale(self, null_logs: np.ndarray) -> tuple[float, float]:
        location, scale = huber_location_scale(null_logs)
        return float(location), float(scale)

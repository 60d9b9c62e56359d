"""A p-value test against a null population, and what every test gets from it: its power.

The paper's rule ("Abar above every reference") has a rank p-value of at least 1/(n + 1) and
reads the references' most extreme value. Here the null distribution of a method's Abar is
measured instead: held-out references ([references] held_out), clean models trained like the
references and scored exactly as an anomalous model is (against all n references, on the same
images). Given the reference set a user has, a clean candidate and the held-out models are
exchangeable, so a test of the candidate's Abar against them is calibrated for *that* reference
set, however typical or extreme it happens to be.

A test fills in one method, ``p_values(null_abars, abars)``: one-sided p-values, small when an
Abar is large, broadcast over leading axes (so a simulation runs thousands of nulls at once).
From it, ``power`` and ``detectable_effect`` measure, by a seeded simulation on a log-normal null,
how far above the clean models a model's log Abar must lie (in null standard deviations) for the
test to flag it with a given probability; ``below_level_p_values`` tests the other direction,
that a model lies below that level. Those two make the three verdicts (evaluate/scoring/verdicts.py).
"""
from __future__ import annotations

import numpy as np

from counteraudit.train.core.registry import Registry
from counteraudit.train.core.suite_checks import named_problems
from counteraudit.train.core.suite_schema import MIN_NULL_MODELS, ReferencesTable

# Null tests: one module each in this package, imported on the first lookup.
NULL_TESTS: Registry = Registry("p-value test", plugins="counteraudit.evaluate.scoring.null_tests")

__all__ = ["NULL_TESTS", "NullTest", "RECOMMENDED_TEST", "power", "detectable_effect",
           "below_level_p_values"]

RECOMMENDED_TEST = "huber"  # why: null_tests/huber.py; its figures: evaluate/benchmarks/null_tests.py

DEFAULT_SIMULATIONS = 20000
LARGEST_EFFECT = 50.0  # null standard deviations; a test that cannot reach its power by then never does


class NullTest:
    """One way to turn a model's Abar into a p-value against the null population's Abars."""

    name: str = ""
    summary: str = ""  # one line: what the p-value is, for the report and --help
    continuous: bool = True  # False: p-values on a grid (a rank), where a KS test says nothing
    min_nulls: int = 2  # null models the test needs; ``check_nulls`` enforces it

    def p_values(self, null_abars: np.ndarray, abars: np.ndarray) -> np.ndarray:
        """``null_abars`` (..., k) and ``abars`` (..., n), all > 0 -> p-values (..., n):
        P(a clean model's Abar >= abar) under this test's model of the null."""
        raise NotImplementedError

    @classmethod
    def nulls_needed(cls) -> int:
        """Fitting nulls a suite must hold for this test: its own minimum, and never fewer than
        ``MIN_NULL_MODELS`` (a null population has a spread)."""
        return max(MIN_NULL_MODELS, cls.min_nulls)

    def location_scale(self, null_logs: np.ndarray) -> tuple[float, float]:
        """The null's location and scale of log Abar as this test sees them: where its power
        level lies (location + detectable effect x scale). The mean and SD, unless the test
        fits others."""
        null_logs = np.asarray(null_logs, dtype=np.float64)
        return float(null_logs.mean()), float(null_logs.std(ddof=1))


def check_nulls(null_abars: np.ndarray, minimum: int) -> np.ndarray:
    """``null_abars`` (..., k) as float64, once they are at least ``minimum`` per row, finite and
    positive; an error saying what to raise otherwise."""
    null_abars = np.asarray(null_abars, dtype=np.float64)
    if null_abars.shape[-1] < minimum:
        raise ValueError(f"a null p-value needs at least {minimum} null models' Abars, got "
                         f"{null_abars.shape[-1]}: raise [references] held_out")
    if not np.all(np.isfinite(null_abars) & (null_abars > 0)):
        raise ValueError(f"null Abars must be finite and positive, got {null_abars}")
    return null_abars


def power(test: NullTest, k: int, effects, *, alpha: float,
          simulations: int = DEFAULT_SIMULATIONS, seed: int = 0,
          outliers: int = 0, outlier_shift: float = 5.0) -> np.ndarray:
    """P(p <= alpha) for a model whose log Abar lies ``effects`` null standard deviations above
    the null mean, tested against k null models (log-normal null; the same draws for every
    effect, so the curve is monotone where the test is). ``outliers``: that many of the k nulls
    lie ``outlier_shift`` SDs higher (clean models that trained unlike the rest), while the
    model tested is drawn from the others' distribution; at effect 0, the test's false-positive
    rate on such a contaminated null."""
    rng = np.random.default_rng(seed)
    null_draws = np.exp(rng.standard_normal((simulations, k))
                        + np.where(np.arange(k) < outliers, outlier_shift, 0.0))
    candidate_noise = rng.standard_normal((simulations, 1))
    effects = np.atleast_1d(np.asarray(effects, dtype=np.float64))
    return np.array([float((test.p_values(null_draws, np.exp(effect + candidate_noise))[:, 0]
                            <= alpha).mean()) for effect in effects])


def detectable_effect(test: NullTest, k: int, *, alpha: float, target_power: float,
                      simulations: int = DEFAULT_SIMULATIONS, seed: int = 0,
                      tolerance: float = 1e-3, outliers: int = 0) -> float:
    """The smallest effect (null standard deviations of log Abar) that ``test`` with k null
    models detects with probability ``target_power`` at ``alpha``; inf when none up to
    ``LARGEST_EFFECT`` does (the empirical test with k + 1 < 1 / alpha: its p-value never gets
    below 1 / (k + 1)). ``outliers``: on a null with that many outlying models (``power``)."""
    def reaches(effect: float) -> bool:
        return power(test, k, [effect], alpha=alpha, simulations=simulations,
                     seed=seed, outliers=outliers)[0] >= target_power
    low, high = 0.0, LARGEST_EFFECT
    if not reaches(high):
        return np.inf
    while high - low > tolerance:
        middle = (low + high) / 2
        low, high = (low, middle) if reaches(middle) else (middle, high)
    return high


def below_level_p_values(test: NullTest, null_abars: np.ndarray, abars: np.ndarray,
                         level_ratio: float) -> np.ndarray:
    """P-values that a model's Abar lies *below* the level the test detects with its power:
    the null population shifted up by ``level_ratio`` (exp of the detectable effect in log
    units), tested in the mirrored direction (1 / Abar). Small: the model looks clean enough
    that the method, which would flag a model at that level with the target power, did not
    see a defect of that size."""
    if not np.isfinite(level_ratio):
        return np.ones(np.shape(abars))
    shifted = np.asarray(null_abars, dtype=np.float64) * level_ratio
    return test.p_values(1.0 / shifted, 1.0 / np.asarray(abars, dtype=np.float64))


def null_test_problems(references: ReferencesTable, p_value: str | None, asked_by: str) -> list[str]:
    """What stops the null p-values (``p_value``, asked for by ``asked_by``: a suite key or a
    command-line option) from being computed: an unknown test, or fewer held-out references left
    to fit it than the test needs (``MIN_NULL_MODELS``, or its ``min_nulls``); one line each, for
    the suite file's error."""
    if p_value is None:
        return []
    problems = named_problems([p_value], NULL_TESTS, f"{asked_by} = {p_value!r}")
    needed = MIN_NULL_MODELS if problems else NULL_TESTS.get(p_value).nulls_needed()
    held_out, checking = references.held_out, references.held_out_check
    fitting = held_out - checking
    if fitting < needed:
        problems.append(
            f"{asked_by} = {p_value!r} fits each method's null distribution to the held-out "
            f"references and needs at least {needed} of them; [references] held_out = "
            f"{held_out} with held_out_check = {checking} leaves {fitting}: set "
            f"[references] held_out = {needed + checking} or more (40 with "
            "held_out_check = 20 fits on 20 and checks the calibration on the other 20)")
    return problems

"""student_t: a Student-t prediction p-value on log Abar (the recommended test).

With k null models whose log Abars have mean m and standard deviation s, a new clean model's
log Abar x satisfies (x - m) / (s * sqrt(1 + 1/k)) ~ t(k - 1) exactly when log Abar is normal
(the prediction interval of a normal sample). Why this test: Abar is a mean of ratios of
distances, positive and right-skewed, and its log is close to symmetric; the fit uses every null
model's value rather than its rank, so its p-value reaches any alpha with a handful of nulls,
where the empirical test's cannot go below 1 / (k + 1). Its calibration rests on that normality,
which is why a suite checks it on a second, disjoint null population ([references]
held_out_check).
"""
from __future__ import annotations

import numpy as np
from scipy.stats import t as student_t

from counteraudit.evaluate.scoring.null_tests.base import NULL_TESTS, NullTest, check_nulls


@NULL_TESTS.register
class StudentT(NullTest):
    name = "student_t"
    summary = "Student-t prediction on log Abar, fitted to the null models"

    def p_values(self, null_abars: np.ndarray, abars: np.ndarray) -> np.ndarray:
        logs = np.log(check_nulls(null_abars, self.min_nulls))
        k = logs.shape[-1]
        mean = logs.mean(axis=-1, keepdims=True)
        scale = logs.std(axis=-1, ddof=1, keepdims=True) * np.sqrt(1 + 1 / k)
        with np.errstate(divide="ignore", invalid="ignore"):
            statistic = (np.log(np.asarray(abars, dtype=np.float64)) - mean) / scale
        # equal nulls (scale 0): any model above them is infinitely far out, one at their value not
        statistic = np.where(np.isnan(statistic), 0.0, statistic)
        return student_t.sf(statistic, df=k - 1)

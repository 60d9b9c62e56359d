"""empirical: the rank of a model's Abar among the null models', (1 + #{null >= Abar}) / (k + 1).

Exact under exchangeability alone (no model of the null's shape), and the smallest value it can
take is 1 / (k + 1): with k null models it cannot reach alpha unless k + 1 >= 1 / alpha (19 nulls
for 0.05), so with fewer it never detects anything and its verdicts are "inconclusive".
"""
from __future__ import annotations

import numpy as np

from counteraudit.evaluate.scoring.null_tests.base import NULL_TESTS, NullTest, check_nulls


@NULL_TESTS.register
class Empirical(NullTest):
    name = "empirical"
    summary = "the rank among the null models, (1 + #{null >= Abar}) / (k + 1)"
    min_nulls = 1
    continuous = False

    def p_values(self, null_abars: np.ndarray, abars: np.ndarray) -> np.ndarray:
        nulls = check_nulls(null_abars, self.min_nulls)
        abars = np.asarray(abars, dtype=np.float64)
        at_least = (nulls[..., None, :] >= abars[..., :, None]).sum(axis=-1)
        return (1 + at_least) / (nulls.shape[-1] + 1)

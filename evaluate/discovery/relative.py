"""Reference-relative scores: how much worse a model does on a subgroup than the references do
on the very same images.

An auditor ranks subgroups by a failure statistic (a median error, a failure rate, an error
ratio, a lift). Ranked as they are, the top of every model's list, references included, is held
by subgroups that are hard for any model (a class drawn in another class's colours), so the
ranking measures the task, not the defect. PromptAttack scores a subgroup by R_f - R_B, the
model's error minus a baseline's; here the baseline is the suite's references:

    relative = (x - mean(r)) / (max(sd(r), floor) * sqrt(1 + 1/R))

with x the model's statistic on the subgroup, r the R references' statistics on the same images
(each reference scored *leave-one-out*: against the other R - 1), sd their sample standard
deviation and ``floor`` the auditor's ``spread_floor`` (where every reference gives the same
value, a tiny difference would otherwise be an infinite score). The sqrt(1 + 1/R) makes it the
statistic of a prediction interval for one more model like the references, so under "this model
is one more reference" it is Student-t with R - 1 degrees of freedom (if the statistic is about
normal across seeds): ``p_value`` is the one-sided tail, and a finding is *significant* where
Benjamini-Hochberg over the model's subgroups keeps it (``significant``).

Findings re-scored this way: ``relative_results.py``. ``score = "absolute"`` ([discover] in a
suite) keeps the statistic as the auditors' source papers ranked by; ``"relative"`` (the default) needs at
least two references.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from scipy.stats import t as student_t
from statsmodels.stats.multitest import multipletests

from counteraudit.train.core.suite_schema import DISCOVER_SCORES

SCORES = DISCOVER_SCORES  # the suite file's [discover] score values: one list
DEFAULT_SCORE = "relative"
MIN_REFERENCES = 2  # a spread needs two
SIGNIFICANCE_FDR = 0.05  # Benjamini-Hochberg over one model's subgroups


def baseline(reference_values: Sequence[float], floor: float) -> tuple[float, float, int]:
    """(mean, scale, R) of the references' statistics on one subgroup: scale = max(sd, floor) *
    sqrt(1 + 1/R). NaN values (a reference without this subgroup) are left out."""
    values = np.asarray([v for v in reference_values if np.isfinite(v)], dtype=np.float64)
    count = len(values)
    if count < MIN_REFERENCES:
        return float("nan"), float("nan"), count
    spread = max(float(values.std(ddof=1)), float(floor))
    return float(values.mean()), spread * math.sqrt(1 + 1 / count), count


def relative_score(value: float, reference_values: Sequence[float], floor: float) -> float:
    """The model's statistic against the references' on the same subgroup (module docstring)."""
    mean, scale, _ = baseline(reference_values, floor)
    return (value - mean) / scale if np.isfinite(scale) else float("nan")


def p_value(score: float, references: int) -> float:
    """One-sided Student-t tail of a relative score against ``references`` references."""
    if not np.isfinite(score) or references < MIN_REFERENCES:
        return float("nan")
    return float(student_t.sf(score, df=references - 1))


def significant(findings: Sequence, references: int,
                fdr: float = SIGNIFICANCE_FDR) -> list[bool]:
    """Which relative findings Benjamini-Hochberg keeps at ``fdr`` (their p-values against
    ``references`` references); NaN scores are never significant."""
    p_values = np.array([p_value(f.statistic, references) for f in findings])
    keep = np.zeros(len(findings), dtype=bool)
    finite = np.isfinite(p_values)
    if finite.any():
        keep[finite] = multipletests(p_values[finite], alpha=fdr, method="fdr_bh")[0]
    return keep.tolist()

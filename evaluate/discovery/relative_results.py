"""Findings re-scored against the baseline models (``relative.py``'s score; the references and
the fitting held-out references, ``reference_evaluations.baseline_models``), leave-one-out for a
baseline model, and re-ranked: what Tables 3 and 4 read under ``score = "relative"``."""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping, Sequence

import numpy as np

from counteraudit.evaluate.discovery.auditors.base import AuditResult, Finding, conditions_key, rank
from counteraudit.evaluate.discovery.relative import baseline


def finding_key(finding: Finding) -> tuple[str, str]:
    """What identifies a finding across models: its subgroup and objective."""
    return conditions_key(finding.conditions), finding.objective


def relative_finding(finding: Finding, reference_values: Sequence[float], floor: float) -> Finding:
    """The finding with its statistic and interval on the relative scale (the references' mean
    and scale applied to the model's own interval)."""
    mean, scale, _ = baseline(reference_values, floor)
    if not np.isfinite(scale):
        return replace(finding, statistic=float("nan"), low=float("nan"), high=float("nan"))
    return replace(finding, statistic=(finding.statistic - mean) / scale,
                   low=(finding.low - mean) / scale, high=(finding.high - mean) / scale)


def relative_result(result: AuditResult, references: Mapping[str, Mapping[tuple[str, str], float]],
                    floor: float, leave_out: str | None = None) -> AuditResult:
    """``result`` re-scored against the baseline models and re-ranked.

    ``references``: baseline model name -> {finding_key: its statistic on the same images};
    ``leave_out``: the model's own name where it is one of them (leave-one-out). A finding no
    two baseline models have a value for gets NaN and ranks last. The notes gain, under
    ``relative``, the baseline's names (``references``), the fewest of them any finding was
    scored against (``references_per_finding``) and the Student-t degrees of freedom that
    gives its p-values (``df``: that count - 1)."""
    others = {name: values for name, values in references.items() if name != leave_out}
    findings, counts = [], []
    for finding in result.findings:
        key = finding_key(finding)
        values = [values.get(key, float("nan")) for values in others.values()]
        findings.append(relative_finding(finding, values, floor))
        counts.append(sum(np.isfinite(v) for v in values))
    ranked_findings = rank([f for f in findings if np.isfinite(f.statistic)])
    ranked_findings += [f for f in findings if not np.isfinite(f.statistic)]
    # the fewest: what bounds the p-values (without findings nothing narrows the baseline)
    fewest = min(counts, default=len(others))
    notes = {**result.notes, "relative": {"references": sorted(others), "leave_out": leave_out,
                                          "floor": floor, "references_per_finding": fewest,
                                          "df": max(fewest - 1, 0)}}
    return AuditResult(ranked_findings, result.images_used, notes, list(result.subgroups))


def baseline_count(result: AuditResult) -> int:
    """How many baseline models a relatively scored result's p-values rest on (the fewest any of
    its findings was scored against: the conservative degrees of freedom, count - 1)."""
    return int(result.notes["relative"]["references_per_finding"])

"""Failure-discovery auditors: a model and the world's factors -> ranked failing subgroups.

Each auditor is one module of ``evaluate/discovery/auditors/``, registered in ``AUDITORS``, which
imports them all on first lookup: adding one is one new file here.
"""
from __future__ import annotations

from counteraudit.evaluate.discovery.auditors.base import (AUDITORS, AuditResult, Auditor, BudgetError,
                                                           Finding, Subgroup, build_auditor, rank,
                                                           ranked)

__all__ = ["AUDITORS", "AuditResult", "Auditor", "BudgetError", "Finding", "Subgroup", "build_auditor",
           "rank", "ranked"]

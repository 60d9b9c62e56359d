"""Failure-discovery auditors: a model and the world's factors -> ranked failing subgroups.

Importing this package imports every module in ``evaluate/discovery/auditors/`` (plug-in discovery), so each
auditor registers itself in ``AUDITORS`` and adding one is one new file here.
"""
from __future__ import annotations

import importlib
import pkgutil

from counteraudit.evaluate.discovery.auditors.base import (AUDITORS, AuditResult, Auditor, BudgetError,
                                                Finding, build_auditor, rank, ranked,
                                                register_auditor)


def discover_auditors() -> list[str]:
    """Import every module of this package (each registers its auditor); idempotent."""
    import counteraudit.evaluate.discovery.auditors as package
    names = [info.name for info in pkgutil.iter_modules(package.__path__)
             if not info.name.startswith("_") and info.name != "base"]
    for name in names:
        importlib.import_module(f"{package.__name__}.{name}")
    return names


discover_auditors()

__all__ = ["AUDITORS", "AuditResult", "Auditor", "BudgetError", "Finding", "build_auditor",
           "rank", "ranked", "register_auditor", "discover_auditors"]

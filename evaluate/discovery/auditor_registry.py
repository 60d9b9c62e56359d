"""The registry of failure-discovery auditors, kept apart from their interface
(auditors/base.py, which loads torch and SciPy): ``discover --help`` lists every auditor with what
it does (``AUDITORS.summaries()``, read from their modules' source) without importing them."""
from __future__ import annotations

from counteraudit.train.core.registry import Registry

# Failure-discovery auditors: one module each in evaluate/discovery/auditors/, imported on the first lookup.
AUDITORS: Registry = Registry("auditor", plugins="counteraudit.evaluate.discovery.auditors")

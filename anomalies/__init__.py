"""Anomaly families. Every module in ``anomalies/families/`` is imported, so a new family is one new file."""
import importlib
import pkgutil

from counteraudit.anomalies import families as _families
from counteraudit.anomalies.base import FAMILIES, AnomalyFamily, register_family

for _module in pkgutil.iter_modules(_families.__path__):
    if not _module.name.startswith("_"):
        importlib.import_module(f"{_families.__name__}.{_module.name}")

__all__ = ["FAMILIES", "AnomalyFamily", "register_family"]

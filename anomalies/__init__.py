"""Anomaly families. Every module in this folder is imported, so a new family is one new file."""
import importlib
import pkgutil

from counteraudit.anomalies.base import FAMILIES, AnomalyFamily, register_family

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base" and not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["FAMILIES", "AnomalyFamily", "register_family"]

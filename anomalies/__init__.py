"""Anomaly families, one file each in ``anomalies/families/``: ``FAMILIES`` imports them all on
first lookup, so a new family is one new file."""
from counteraudit.anomalies.base import FAMILIES, AnomalyFamily

__all__ = ["FAMILIES", "AnomalyFamily"]

"""Every plug-in kind's registry, each naming the package its plug-ins live in.

A plug-in registers itself with ``@REGISTRY.register`` (a class) or ``REGISTRY.register(entry)``
(an instance), under its ``name``. The package is named by string and imported on first lookup
(train/core/registry.py), so this module imports no plug-in: the lower layers (a suite file's
check, the trainer) look up the plug-ins of the higher ones here without importing those
packages, and the layer contract (pyproject.toml's [tool.importlinter]) holds. The base modules
(anomalies/base.py, explain/base.py, ...) re-export their kind's registry.
"""
from __future__ import annotations

from counteraudit.train.core.registry import Registry

WORLDS: Registry[type] = Registry("world", plugins="counteraudit.train.worlds")
ARCHITECTURES: Registry = Registry("architecture", plugins="counteraudit.train.architectures")
FAMILIES: Registry[type] = Registry("anomaly family", plugins="counteraudit.anomalies.families")
METHODS: Registry[type] = Registry("method", plugins="counteraudit.explain.methods")
RENDERERS: Registry[type] = Registry("renderer", plugins="counteraudit.explain.renderers")
DISTANCES: Registry[type] = Registry("distance", plugins="counteraudit.evaluate.scoring.distances")
AUDITORS: Registry[type] = Registry("auditor", plugins="counteraudit.evaluate.discovery.auditors")
SELECTIONS: Registry[type] = Registry("selection function",
                                      plugins="counteraudit.evaluate.discovery.selection")
NULL_TESTS: Registry[type] = Registry("p-value test",
                                      plugins="counteraudit.evaluate.scoring.null_tests")
PROTOCOL_CHOICES: Registry = Registry("protocol choice",
                                      plugins="counteraudit.evaluate.studies.protocol_choices")


def strength_families() -> dict[str, str]:
    """family name -> its strength parameter, for every registered family that has one."""
    return {name: FAMILIES.get(name).strength for name in FAMILIES
            if FAMILIES.get(name).strength is not None}

"""The registries of the plug-in kinds training needs, each naming the package its plug-ins live in.

A plug-in registers itself with ``@REGISTRY.register`` (a class) or ``REGISTRY.register(entry)``
(an instance), under its ``name``. The package is named by string and imported on first lookup
(train/core/registry.py), so this module imports no plug-in.

Worlds and architectures are training's own. Anomaly families are the one kind from a higher
layer named here: a family changes how a model trains (its data, its batches, PGD through the
model), and a model's key holds its family's parameters, so reading a suite and training a model
both need them, while the layer contract (pyproject.toml's [tool.importlinter]) forbids train/
importing anomalies/. Every other kind (explanation methods, renderers, auditors, selection
functions, distances, null tests, protocol choices) keeps its registry in its own package
(explain/base.py, evaluate/discovery/auditors/base.py, ...), and the entry scripts that run those
layers check a suite's tables of them (explain/settings.py, evaluate/pipeline.py).
"""
from __future__ import annotations

from counteraudit.train.core.registry import Registry

WORLDS: Registry[type] = Registry("world", plugins="counteraudit.train.worlds")
ARCHITECTURES: Registry = Registry("architecture", plugins="counteraudit.train.architectures")
FAMILIES: Registry[type] = Registry("anomaly family", plugins="counteraudit.anomalies.families")


def strength_families() -> dict[str, str]:
    """family name -> its strength parameter, for every registered family that has one."""
    return {name: FAMILIES.get(name).strength for name in FAMILIES
            if FAMILIES.get(name).strength is not None}

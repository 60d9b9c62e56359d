"""Explanation methods: models x images -> rendered visualizations (uint8 images).

Importing ``explain`` imports every module in ``explain/methods/`` (plug-in discovery), so each
method registers itself in ``METHODS`` and adding a method is one new file there.
"""
from __future__ import annotations

import importlib
import pkgutil

from counteraudit.explain.base import (METHODS, AttributionMethod, BatchOutput, Explanation,
                                       ExplanationMethod, VisualizationMethod, build_method,
                                       register_method)
from counteraudit.explain.explainable import explainable
from counteraudit.explain.params import execution_only
from counteraudit.explain.render import RENDERER_VERSION


def discover_methods() -> list[str]:
    """Import every module of the ``explain.methods`` package (each registers its method).

    Idempotent: already imported modules are not re-run. Returns the module names imported.
    """
    import counteraudit.explain.methods as package

    names = [info.name for info in pkgutil.iter_modules(package.__path__) if not info.name.startswith("_")]
    for name in names:
        importlib.import_module(f"{package.__name__}.{name}")
    return names


discover_methods()

__all__ = ["METHODS", "AttributionMethod", "BatchOutput", "Explanation", "ExplanationMethod",
           "VisualizationMethod", "build_method", "register_method", "explainable",
           "execution_only", "RENDERER_VERSION", "discover_methods"]

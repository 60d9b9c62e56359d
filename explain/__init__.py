"""Explanation methods: models x images -> rendered visualizations (uint8 images).

Each method is one file in ``explain/methods/``, registered in ``METHODS``, which imports them all
on first lookup: adding a method is one new file there.
"""
from __future__ import annotations

from counteraudit.explain.base import (METHODS, AttributionMethod, BatchOutput, Explanation,
                                       ExplanationMethod, VisualizationMethod, build_method)
from counteraudit.explain.explainable import explainable
from counteraudit.train.core.params import execution_only
from counteraudit.explain.render import RENDERER_VERSION

__all__ = ["METHODS", "AttributionMethod", "BatchOutput", "Explanation", "ExplanationMethod",
           "VisualizationMethod", "build_method", "explainable", "execution_only", "RENDERER_VERSION"]

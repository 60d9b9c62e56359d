"""Defect detectors: a trained model (and what a defender has beside it) -> how suspect it is.

Each detector is one module of this folder, registered in ``DETECTORS``, which imports them all
on first lookup: adding one is one new file here.
"""
from __future__ import annotations

from counteraudit.evaluate.defect_detectors.detectors.base import (DETECTORS, Detector, Evidence,
                                                                   Inspection, TrainingSample,
                                                                   build_detector)

__all__ = ["DETECTORS", "Detector", "Evidence", "Inspection", "TrainingSample", "build_detector"]

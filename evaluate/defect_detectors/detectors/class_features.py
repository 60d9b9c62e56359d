"""The training rows of each class, by the label trained on: the unit of analysis of the latent
separability detectors (spectral signatures, activation clustering), which look for a second
population inside one class's penultimate features."""
from __future__ import annotations

import numpy as np

from counteraudit.evaluate.defect_detectors.detectors.base import Evidence, penultimate_features


def training_features(model, evidence: Evidence) -> tuple[np.ndarray, np.ndarray]:
    """(penultimate features (N, d) float64, labels trained on (N,)) of the training sample."""
    features = penultimate_features(model, evidence.training.images).numpy()
    return features, evidence.training.labels.numpy().astype(np.int64)


def rows_by_class(labels: np.ndarray, num_classes: int) -> list[np.ndarray]:
    """Row positions of each class in class order (an empty array for a class with none)."""
    return [np.flatnonzero(labels == label) for label in range(num_classes)]


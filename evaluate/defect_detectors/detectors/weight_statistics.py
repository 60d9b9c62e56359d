"""Control: per-layer statistics of the weights, and nothing else (no input, no output).

The statistics Unterthiner et al. (2020, "Predicting neural network accuracy from weights") found
to predict a small CNN's accuracy and training settings: per convolution and linear layer, the
mean, the standard deviation and five quantiles (0, 25, 50, 75, 100%) of its weights. Here each
layer gives log(std) and the other six divided by its std, so that every layer weighs alike in the
Euclidean anomaly score whatever its scale. A defect this control detects is visible in the
weights without running the model: a detection by an explanation method of the same family then
shows only that the model differs, not that the method saw the defect.

Sums are exact (``math.fsum``) and quantiles are order statistics, so the vector has the same bits
on every CPU.
"""
from __future__ import annotations

import math

import numpy as np
from torch import nn

from counteraudit.evaluate.defect_detectors.detectors.base import DETECTORS, Detector, Evidence, Inspection

QUANTILES = (0.0, 0.25, 0.5, 0.75, 1.0)


def layer_statistics(weights: np.ndarray) -> list[float]:
    """[log std, mean / std, each quantile / std] of one layer's weights (float64)."""
    values = np.sort(np.asarray(weights, dtype=np.float64).ravel())
    mean = math.fsum(values) / len(values)
    std = math.sqrt(math.fsum((values - mean) ** 2) / len(values))
    positions = [round(q * (len(values) - 1)) for q in QUANTILES]  # lower-median order statistic
    return [math.log(std), mean / std, *(float(values[p]) / std for p in positions)]


@DETECTORS.register
class WeightStatistics(Detector):
    name = "weight_statistics"
    control = True
    mechanism = "control: weight statistics only"

    def inspect(self, model: nn.Module, evidence: Evidence) -> Inspection:
        layers = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
        statistic = [value for layer in layers
                     for value in layer_statistics(layer.weight.detach().cpu().numpy())]
        return Inspection(statistic=np.asarray(statistic), notes={"layers": len(layers)})

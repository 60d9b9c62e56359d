"""Control method: the model's softmax probabilities drawn as a bar chart, nothing else.

A baseline for the benchmark: a visualization that carries only what the model outputs on this
image. A method that detects no more than this control adds nothing beyond the model's outputs.
The chart has the input's height and width (render.probability_bars).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from counteraudit.explain.base import METHODS, BatchContext, BatchOutput, VisualizationMethod
from counteraudit.explain.render import probability_bars


@METHODS.register
class OutputsOnly(VisualizationMethod):
    name = "outputs_only"
    default_batch_size = 64

    def visualize(self, model: nn.Module, images: torch.Tensor, targets: torch.Tensor,
                  context: BatchContext) -> BatchOutput:
        with torch.no_grad():
            probabilities = torch.softmax(model(images), dim=1).cpu().numpy().astype(np.float32)
        height, width = images.shape[-2:]
        return BatchOutput(images=probability_bars(probabilities, height, width), raw=probabilities)

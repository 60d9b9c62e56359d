"""The model as a function of its normalised input, for methods that work in that space.

The project's models take [0, 1] pixels and normalise them themselves
(``train.architectures.Classifier``: ``backbone((x - mean) / std)``); the paper's code normalised
the images first and gave the libraries ``z = (x - mean) / std``. So gradients there are taken
with respect to z (a factor std per channel from the pixels' gradients), integrated gradients'
default zero baseline is z = 0 (the mean colour), and Grad-CAM's test-time augmentation scales z
(a contrast change around the mean colour) rather than x (a brightness change).
``on_normalized_input`` gives the backbone, which maps z to the logits, and z: the same modules
(hooks and layers resolved on the model still apply), no re-normalisation round trip.
"""
from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import nn

from counteraudit.train.architectures import Classifier


def normalization(model: nn.Module, method: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The (1, 3, 1, 1) mean and std a ``Classifier`` normalises its input with."""
    if not isinstance(model, Classifier):
        raise ValueError(f"method {method!r}: the normalised input space needs a model that "
                         f"normalises its input itself (train.architectures.Classifier), got "
                         f"{type(model).__name__}; use the pixel space (gradient_space = "
                         "'pixels', aug_smooth_space = 'pixels')")
    return model.mean, model.std


class _BackboneInClassIndices(nn.Module):
    """The backbone of a model whose output layer lacks some classes (``drop_output``), with
    its logits spread into the world's class indices as the model's own forward does, so the
    explained class means the same class as on every other model."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, normalized: torch.Tensor) -> torch.Tensor:
        return self.model.in_class_indices(self.model.backbone(normalized))


def on_normalized_input(model: nn.Module, images: torch.Tensor,
                        method: str) -> tuple[nn.Module, torch.Tensor]:
    """(the model as a function of z, z) for [0, 1] ``images``."""
    mean, std = normalization(model, method)
    function = model.backbone if model.output_classes is None else _BackboneInClassIndices(model)
    return function, (images - mean) / std


def in_gradient_space(model: nn.Module, images: torch.Tensor, gradient_space: str,
                      method: str) -> tuple[nn.Module, torch.Tensor]:
    """(the function attributed, its input) for a method's ``gradient_space``: the model and the
    [0, 1] pixels, or (``on_normalized_input``) the model of the normalised input and that input."""
    if gradient_space == "normalized":
        return on_normalized_input(model, images, method)
    return model, images


Baseline = Literal["normalized_zero", "black"]
BASELINES = get_args(Baseline)


def baseline_image(model: nn.Module, inputs: torch.Tensor, baseline: str, normalized_space: bool,
                   method: str) -> torch.Tensor:
    """The reference image named ``baseline`` for ``inputs`` in the space they are in:
    "normalized_zero" (zero normalised input, the mean colour in pixels: the paper's integrated
    gradients) or "black" (zero pixels)."""
    if baseline == ("normalized_zero" if normalized_space else "black"):
        return torch.zeros_like(inputs)  # zero in the space the method works in
    mean, std = normalization(model, method)  # the other space's zero, mapped into this one
    zero = -mean / std if normalized_space else mean
    return zero.to(inputs).expand_as(inputs).contiguous()

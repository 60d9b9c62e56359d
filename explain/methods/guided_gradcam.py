"""Guided Grad-CAM (Selvaraju et al. 2019) with captum's ``GuidedGradCam``.

Layer: the architecture's ``guided_gradcam_layer`` (the last convolution) unless set. Other
parameters (``SaliencyParams``): explained class, gradient space (the paper: the normalised
input), renderer.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from captum.attr import GuidedGradCam as CaptumGuidedGradCam
from torch import nn

from counteraudit.explain.base import METHODS, AttributionMethod, SaliencyParams, architecture_default
from counteraudit.explain.input_space import in_gradient_space
from counteraudit.train.architectures import layer_name, resolve_layer


@METHODS.register
class GuidedGradCam(AttributionMethod):
    name = "guided_gradcam"
    default_batch_size = 32

    @dataclass(frozen=True)
    class Params(SaliencyParams):
        layer: str | None = None          # an address "(4,0,3)" or module name; None: architecture's
        interpolate_mode: str = "nearest"  # captum's default upsampling of the CAM

    def resolve(self, architecture: str | None) -> Params:
        layer = self.params.layer or architecture_default(
            architecture, "guided_gradcam_layer", self.name, "layer")
        return replace(self.params, layer=layer_name(layer))

    def attribute(self, model: nn.Module, images: torch.Tensor,
                  targets: torch.Tensor) -> torch.Tensor:
        params = self.params_for(model)
        layer = resolve_layer(model, params.layer)  # on the model: the same module in both spaces
        model, images = in_gradient_space(model, images, params.gradient_space, self.name)
        method = CaptumGuidedGradCam(model, layer)
        return method.attribute(images, target=targets, interpolate_mode=params.interpolate_mode)

"""Grad-CAM (Selvaraju et al. 2019) with pytorch-grad-cam's ``GradCAM``.

Layer: the architecture's ``gradcam_layer`` (the last bottleneck's conv3) unless set.
``aug_smooth=True`` as in the paper's code: the CAM is averaged over 6 test-time augmentations
(horizontal flip x multiplication by 0.9/1/1.1), so it costs 6 forward/backward passes; set
``aug_smooth = false`` in ``[methods.gradcam]`` for a 6x faster, noisier map. The library
multiplies whatever input it is given: ``aug_smooth_space = "normalized"`` gives it the normalised
image (the paper's code, which normalised first: a contrast change around the mean colour),
``"pixels"`` the [0, 1] image (the project's first choice: a brightness change). The raw output
is pytorch-grad-cam's CAM, already scaled to [0, 1] per image, (N, H, W); the renderer
``show_cam_on_image`` is the paper's call, ``jet_overlay`` the project's first one.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from pytorch_grad_cam import GradCAM as LibraryGradCAM
from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget
from torch import nn

from counteraudit.explain.base import (DEFAULT_RENDERERS, GRADIENT_SPACES, METHODS, AttributionMethod,
                                       TargetParams, architecture_default)
from counteraudit.explain.input_space import on_normalized_input
from counteraudit.explain.params import added
from counteraudit.explain.renderers import CAMS
from counteraudit.train.architectures import layer_name, resolve_layer


@METHODS.register
class GradCam(AttributionMethod):
    name = "gradcam"
    default_batch_size = 32
    renders = CAMS

    @dataclass(frozen=True)
    class Params(TargetParams):
        layer: str | None = None  # an address "(4,0,3)" or module name; None: architecture's
        aug_smooth: bool = True
        aug_smooth_space: str = added("pixels", choices=GRADIENT_SPACES)
        renderer: str = added(DEFAULT_RENDERERS[CAMS])
        renderer_options: dict[str, Any] | None = added(None)

    def resolve(self, architecture: str | None) -> Params:
        layer = self.params.layer or architecture_default(
            architecture, "gradcam_layer", self.name, "layer")
        return replace(self.params, layer=layer_name(layer))

    def passes_per_image(self, architecture: str | None) -> float:
        return 6.0 if self.params.aug_smooth else 1.0

    def attribute(self, model: nn.Module, images: torch.Tensor,
                  targets: torch.Tensor) -> torch.Tensor:
        params = self.params_for(model)
        layer = resolve_layer(model, params.layer)  # on the model: the same module in both spaces
        if params.aug_smooth_space == "normalized":
            model, images = on_normalized_input(model, images, self.name)
        # The explainable copy has frozen weights, so the input must require grad for the target
        # layer's output to carry a gradient (pytorch-grad-cam reads it from a tensor hook).
        images = images.detach().requires_grad_(True)
        cam = LibraryGradCAM(model, [layer])
        try:  # not `with`: BaseCAM.__exit__ swallows IndexErrors
            maps = cam(images, targets=[ClassifierOutputTarget(int(t)) for t in targets],
                       aug_smooth=params.aug_smooth)
        finally:
            cam.activations_and_grads.release()
        return torch.from_numpy(np.asarray(maps, np.float32))

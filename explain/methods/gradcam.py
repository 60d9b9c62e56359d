"""Grad-CAM (Selvaraju et al. 2019) with pytorch-grad-cam's ``GradCAM``, and ``LibraryCam``, the
base every pytorch-grad-cam method of the project shares (explain/methods/gradcam_family.py).

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

import contextlib
import io
from dataclasses import dataclass, fields, replace
from importlib.metadata import PackageNotFoundError, version
from typing import Any, ClassVar

import numpy as np
import pytorch_grad_cam
import torch
from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget
from torch import nn

from counteraudit.explain.base import (DEFAULT_RENDERERS, GradientSpace, METHODS, AttributionMethod,
                                       TargetParams, architecture_default)
from counteraudit.explain.input_space import on_normalized_input
from counteraudit.train.core.params import added
from counteraudit.explain.renderers import CAMS
from counteraudit.train.architectures import layer_name, resolve_layer

LIBRARY = "grad-cam"  # pytorch-grad-cam's name on PyPI


def installed_library_version() -> str:
    try:
        return version(LIBRARY)
    except PackageNotFoundError:
        return "unknown"


def library_cam_class(class_name: str, since: str, method: str) -> type:
    """pytorch-grad-cam's ``class_name``, or one clear error naming the version that has it
    (an older grad-cam lacks the newer methods)."""
    cam_class = getattr(pytorch_grad_cam, class_name, None)
    if cam_class is None:
        raise ImportError(f"method {method!r} needs {LIBRARY} >= {since} (installed: "
                          f"{installed_library_version()}): pytorch_grad_cam.{class_name} is "
                          f"missing; pip install '{LIBRARY}>={since}'")
    return cam_class


@dataclass(frozen=True)
class CamParams(TargetParams):
    """Parameters of a CAM method on one layer (field order kept: it is Grad-CAM's record)."""
    layer: str | None = None  # an address "(4,0,3)" or module name; None: architecture's
    aug_smooth: bool = True
    aug_smooth_space: GradientSpace = added("pixels")
    renderer: str = added(DEFAULT_RENDERERS[CAMS])
    renderer_options: dict[str, Any] | None = added(None)


class LibraryCam(AttributionMethod):
    """A pytorch-grad-cam method: ``library_class`` (present from grad-cam ``since``) on the
    layer its parameters or the model's architecture name (``layer``; a method whose Params
    have no ``layer`` field gets no target layers), with the library's test-time augmentation
    (``aug_smooth``) in the pixel or normalised space. Subclasses set the names and, where the
    library's constructor needs more, override ``make_cam``."""

    default_batch_size = 32
    renders = CAMS
    Params: ClassVar[type] = CamParams
    library_class: ClassVar[str] = ""
    since: ClassVar[str] = ""
    # Forward (+ backward) passes of one view of one image, for the explain stage's scheduling.
    passes_per_view: ClassVar[float] = 1.0
    # The library draws a tqdm progress bar per image for its masked forwards: silenced.
    quiet: ClassVar[bool] = False

    def __init__(self, params: Any = None):
        super().__init__(params)
        # Here, not at import: every other method still runs with an older grad-cam.
        self.cam_class = library_cam_class(self.library_class, self.since, self.name)

    @property
    def has_layer(self) -> bool:
        return any(f.name == "layer" for f in fields(self.Params))

    def resolve(self, architecture: str | None) -> Any:
        if not self.has_layer:
            return self.params
        layer = self.params.layer or architecture_default(
            architecture, "gradcam_layer", self.name, "layer")
        return replace(self.params, layer=layer_name(layer))

    def passes_per_image(self, architecture: str | None) -> float:
        return (6.0 if self.params.aug_smooth else 1.0) * self.passes_per_view

    def make_cam(self, model: nn.Module, layers: list[nn.Module], params: Any) -> Any:
        """The library's CAM object on ``model``; override to pass more constructor arguments."""
        return self.cam_class(model, layers)

    def attribute(self, model: nn.Module, images: torch.Tensor,
                  targets: torch.Tensor) -> torch.Tensor:
        params = self.params_for(model)
        # Resolved on the model: the same module in both spaces.
        layers = [resolve_layer(model, params.layer)] if self.has_layer else []
        if params.aug_smooth_space == "normalized":
            model, images = on_normalized_input(model, images, self.name)
        # The explainable copy has frozen weights, so the input must require grad for the target
        # layer's output to carry a gradient (pytorch-grad-cam reads it from a tensor hook).
        images = images.detach().requires_grad_(True)
        cam = self.make_cam(model, layers, params)
        quiet = contextlib.redirect_stderr(io.StringIO()) if self.quiet else contextlib.nullcontext()
        try:  # not `with cam`: BaseCAM.__exit__ swallows IndexErrors
            with quiet:
                maps = cam(images, targets=[ClassifierOutputTarget(int(t)) for t in targets],
                           aug_smooth=params.aug_smooth)
        finally:
            cam.activations_and_grads.release()
        return torch.from_numpy(np.asarray(maps, np.float32))


@METHODS.register
class GradCam(LibraryCam):
    """Grad-CAM: the layer's activations weighted by their spatially averaged gradients."""
    name = "gradcam"
    library_class = "GradCAM"
    since = "1.1.0"

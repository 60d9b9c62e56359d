"""The other CAM methods of pytorch-grad-cam, each a thin entry on Grad-CAM's machinery
(``LibraryCam``, explain/methods/gradcam.py): same target layer (the architecture's
``gradcam_layer`` unless ``layer`` is set), same test-time augmentation (``aug_smooth``, default
on as for Grad-CAM, ``aug_smooth_space``), same CAM renderers; raw output (N, H, W) in [0, 1].

Each entry names the pytorch-grad-cam class and the grad-cam release that first has it (with its
parameters as used here); an older installed grad-cam gives one error naming that version.

The two perturbation methods cost one masked forward pass per channel of the layer (256 on the
small ResNet's layer4.0.conv3, 2048 on ResNet-50's layer4.2.conv3) per view, so their budget is a
parameter (checked when the suite is read): ``batch_size``, how many masked copies one forward
pass takes (memory; the result is the same up to float rounding, so it is not recorded), and for
Ablation-CAM ``ratio_channels_to_ablate``, the fraction of channels ablated (recorded: it changes
the map; the others keep the unablated score).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from pytorch_grad_cam.ablation_layer import AblationLayer
from torch import nn

from counteraudit.explain.base import DEFAULT_RENDERERS, GradientSpace, METHODS, TargetParams
from counteraudit.explain.methods.gradcam import CamParams, LibraryCam
from counteraudit.train.core.params import added, at_most, execution_only
from counteraudit.explain.renderers import CAMS
from counteraudit.train.core import size_bounds as bounds


# ---------------------------------------------------------------- gradient-weighted CAMs
@METHODS.register
class GradCamPlusPlus(LibraryCam):
    """Grad-CAM++ (Chattopadhay et al. 2018): channel weights from positive gradients with
    higher-order terms (pytorch-grad-cam ``GradCAMPlusPlus``)."""
    name = "gradcam_plusplus"
    library_class = "GradCAMPlusPlus"
    since = "1.1.0"


@METHODS.register
class XGradCam(LibraryCam):
    """XGrad-CAM (Fu et al. 2020): gradients weighted by the normalised activations
    (pytorch-grad-cam ``XGradCAM``)."""
    name = "xgradcam"
    library_class = "XGradCAM"
    since = "1.1.0"


@METHODS.register
class HiResCam(LibraryCam):
    """HiResCAM (Draelos & Carin 2020): activations times gradients element-wise, summed over
    channels (pytorch-grad-cam ``HiResCAM``)."""
    name = "hirescam"
    library_class = "HiResCAM"
    since = "1.4.2"


@METHODS.register
class GradCamElementWise(LibraryCam):
    """Grad-CAM element-wise: HiResCAM with a ReLU on each element before the channel sum
    (pytorch-grad-cam ``GradCAMElementWise``)."""
    name = "gradcam_elementwise"
    library_class = "GradCAMElementWise"
    since = "1.4.0"


@METHODS.register
class LayerCam(LibraryCam):
    """LayerCAM (Jiang et al. 2021): activations weighted by their positive gradients, per
    location (pytorch-grad-cam ``LayerCAM``)."""
    name = "layercam"
    library_class = "LayerCAM"
    since = "1.3.0"


# ---------------------------------------------------------------- principal components
@METHODS.register
class EigenCam(LibraryCam):
    """Eigen-CAM (Muhammad & Yeasin 2020): the first principal component of the layer's
    activations; class-agnostic (no gradients, same map for every class)
    (pytorch-grad-cam ``EigenCAM``)."""
    name = "eigencam"
    library_class = "EigenCAM"
    since = "1.2.3"


@METHODS.register
class EigenGradCam(LibraryCam):
    """Eigen-Grad-CAM: the first principal component of activations times gradients
    (pytorch-grad-cam ``EigenGradCAM``)."""
    name = "eigengradcam"
    library_class = "EigenGradCAM"
    since = "1.2.4"


# ---------------------------------------------------------------- all biases
@dataclass(frozen=True)
class FullGradParams(TargetParams):
    """FullGrad's parameters: no layer (it uses every bias). ``aug_smooth_space`` also sets the
    space of its input-gradient term."""
    aug_smooth: bool = True
    aug_smooth_space: GradientSpace = added("pixels")
    renderer: str = added(DEFAULT_RENDERERS[CAMS])
    renderer_options: dict[str, Any] | None = added(None)


@METHODS.register
class FullGrad(LibraryCam):
    """FullGrad (Srinivas & Fleuret 2019): |input x input gradient| plus |bias x gradient| of
    every Conv2d and BatchNorm2d bias (BatchNorm's running statistics folded in), each scaled
    and summed (pytorch-grad-cam ``FullGrad``; no ``layer``).

    The project's models normalise inside forward, (x - mean) / std, a bias that is no module's:
    with ``aug_smooth_space = "pixels"`` (default) the input term is x * df/dx and that bias is
    left out of the decomposition; with ``"normalized"`` the library is given the backbone and
    z = (x - mean) / std, and z * df/dz + the module biases is FullGrad's complete decomposition
    of the logit (as the paper's code, which normalised first, would have it)."""
    name = "fullgrad"
    library_class = "FullGrad"
    since = "1.3.1"
    Params = FullGradParams
    passes_per_view = 1.5  # the backward reaches the input and every bias layer's output


# ---------------------------------------------------------------- perturbation
@dataclass(frozen=True)
class ScoreCamParams(CamParams):
    # Masked copies per forward pass (pytorch-grad-cam's ScoreCAM.batch_size).
    batch_size: Annotated[int, at_most(bounds.BATCH)] | None = execution_only(32)


@dataclass(frozen=True)
class AblationCamParams(CamParams):
    # Ablated copies per forward pass (pytorch-grad-cam's AblationCAM batch_size).
    batch_size: Annotated[int, at_most(bounds.BATCH)] | None = execution_only(32)
    # Fraction of the layer's channels ablated, in (0, 1] (1.0: all, the method as published).
    ratio_channels_to_ablate: float | None = 1.0


class PerturbationCam(LibraryCam):
    """A CAM from masked forward passes, one per channel of the layer: its budget is required."""
    quiet = True
    passes_per_view = 64.0  # a rough share of the channels' forwards (batched, no backward)
    budget_hints: ClassVar[dict[str, str]] = {
        "batch_size": "masked copies per forward pass, e.g. 32 (memory, not the result)"}

    def __init__(self, params: Any = None):
        super().__init__(params)
        for key, hint in self.budget_hints.items():
            if getattr(self.params, key) is None:
                raise ValueError(f"method {self.name!r} needs its budget {key!r}: set {key} in "
                                 f"[methods.{self.name}] ({hint})")
        if self.params.batch_size < 1:
            raise ValueError(f"method {self.name!r}: batch_size = {self.params.batch_size} must "
                             f"be >= 1 (masked copies per forward pass)")


@METHODS.register
class ScoreCam(PerturbationCam):
    """Score-CAM (Wang et al. 2020): channel weights are the softmax over channels of the target
    score of the image masked by each upsampled, min-max scaled activation map
    (pytorch-grad-cam ``ScoreCAM``); budget ``batch_size``."""
    name = "scorecam"
    library_class = "ScoreCAM"
    since = "1.1.0"
    Params = ScoreCamParams

    def make_cam(self, model: nn.Module, layers: list[nn.Module], params: Any) -> Any:
        cam = self.cam_class(model, layers)
        cam.batch_size = params.batch_size  # read by ScoreCAM.get_cam_weights (default 16)
        return cam


@METHODS.register
class AblationCam(PerturbationCam):
    """Ablation-CAM (Desai & Ramaswamy 2020): channel weights are the relative drop of the target
    score when each channel is zeroed (pytorch-grad-cam ``AblationCAM``); budget ``batch_size``
    and ``ratio_channels_to_ablate`` (below 1, the library picks the channels inside the
    activations' first principal component's mask: an approximation)."""
    name = "ablationcam"
    library_class = "AblationCAM"
    since = "1.3.7"  # ratio_channels_to_ablate
    Params = AblationCamParams
    budget_hints = {**PerturbationCam.budget_hints,
                    "ratio_channels_to_ablate": "fraction of channels ablated, in (0, 1]; 1.0: all"}

    def __init__(self, params: Any = None):
        super().__init__(params)
        ratio = self.params.ratio_channels_to_ablate
        if not 0 < ratio <= 1:
            raise ValueError(f"method {self.name!r}: ratio_channels_to_ablate = {ratio} must be "
                             "in (0, 1] (the fraction of the layer's channels ablated)")

    def make_cam(self, model: nn.Module, layers: list[nn.Module], params: Any) -> Any:
        # A fresh ablation layer: the library's default argument is one instance shared by every
        # AblationCAM, and it keeps state between calls.
        return self.cam_class(model, layers, ablation_layer=AblationLayer(),
                              batch_size=params.batch_size,
                              ratio_channels_to_ablate=params.ratio_channels_to_ablate)

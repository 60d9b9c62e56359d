"""Classifier architectures, and the paper's (stage, block, conv) layer addressing (Denain &
Steinhardt, 2023): ``(2,2,1)`` is conv1 of block 2 of stage 2 (torchvision's ``layer2.2.conv1``),
``(3,3)`` the output of block 3 of stage 3.

Every model takes images in [0, 1] (N, 3, H, W) and normalises them itself, so pixel-space
operations (triggers, smoothing noise, PGD budgets, explanation baselines) need no knowledge of
the world's mean and std. The backbone keeps torchvision's ResNet module names (``layer2.2.conv1``),
so a layer address means the same thing on ResNet-50 and on the small CPU ResNet.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import nn
from torchvision.models import resnet50
from torchvision.models.resnet import Bottleneck, ResNet

from counteraudit.train.core.registries import ARCHITECTURES


@dataclass(frozen=True)
class Architecture:
    name: str
    build_backbone: Callable[[int], nn.Module]  # num_classes -> backbone taking normalised input
    # Layers visualised by Caricatures: the paper's seven, spread over early and late stages and
    # blocks; the overall Caricature score averages them.
    caricature_layers: Sequence[str]
    # Grad-CAM's layer: the last bottleneck's conv3 (the paper's pytorch-grad-cam target).
    gradcam_layer: str
    # Guided Grad-CAM's layer (captum GuidedGradCam on the last conv layer).
    guided_gradcam_layer: str
    description: str = ""
    # Bump when the builder changes the weights' shapes or initialisation: the version is part of
    # every model's key, so checkpoints of an older definition are never loaded into a new one.
    version: int = 1


# The logit a Classifier gives a class its output layer lacks (a missing-class model with 999
# outputs): finite, so softmax gives it probability exactly 0 (exp underflows) while
# log-probabilities, entropies and losses stay finite; within bfloat16's and float16's range.
ABSENT_CLASS_LOGIT = -1e4


class Classifier(nn.Module):
    """Normalisation + backbone. Input: images in [0, 1]. Output: logits, one per class of the world.

    ``output_classes``: the world's classes the backbone's outputs stand for, in order, when the
    output layer lacks some (the paper's missing-class models have 999 outputs). The backbone's
    logits are then spread into the world's class indices and every absent class gets
    ``ABSENT_CLASS_LOGIT``, so predictions, accuracies, targets and comparisons across models all
    speak the world's class indices."""

    def __init__(self, backbone: nn.Module, mean: Sequence[float], std: Sequence[float],
                 architecture: str, num_classes: int | None = None,
                 output_classes: Sequence[int] | None = None):
        super().__init__()
        self.backbone = backbone
        self.architecture = architecture
        # Not persistent: checkpoints hold weights only, and external checkpoints never have these.
        self.register_buffer("mean", torch.tensor(mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, 3, 1, 1), persistent=False)
        self.num_classes = num_classes
        self.register_buffer("output_classes", None if output_classes is None else
                             torch.as_tensor(list(output_classes), dtype=torch.long), persistent=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.in_class_indices(self.backbone((images - self.mean) / self.std))

    def in_class_indices(self, logits: torch.Tensor) -> torch.Tensor:
        """The backbone's logits spread into the world's class indices (absent classes:
        ``ABSENT_CLASS_LOGIT``); unchanged when the output layer has every class."""
        if self.output_classes is None:
            return logits
        full = logits.new_full((logits.shape[0], self.num_classes), ABSENT_CLASS_LOGIT)
        return full.index_copy(1, self.output_classes, logits)


def build_model(architecture: str, num_classes: int, mean: Sequence[float],
                std: Sequence[float], output_classes: Sequence[int] | None = None) -> Classifier:
    """``output_classes``: the classes the output layer has (default: all ``num_classes``)."""
    arch = ARCHITECTURES.get(architecture)
    if output_classes is None:
        return Classifier(arch.build_backbone(num_classes), mean, std, architecture)
    output_classes = sorted(int(c) for c in output_classes)
    if not output_classes or output_classes[0] < 0 or output_classes[-1] >= num_classes \
            or len(set(output_classes)) != len(output_classes):
        raise ValueError(f"output_classes must be distinct class indices in 0..{num_classes - 1}, "
                         f"got {len(output_classes)} from {output_classes[:1]} to {output_classes[-1:]}")
    return Classifier(arch.build_backbone(len(output_classes)), mean, std, architecture,
                      num_classes, output_classes)


# ---------------------------------------------------------------- layer addressing
_ADDRESS = re.compile(r"^\(?\s*(\d+)\s*,\s*(\d+)\s*(?:,\s*(\d+)\s*)?\)?$")


def layer_name(address: str | Sequence[int]) -> str:
    """(stage, block, conv) or (stage, block) -> torchvision module name.

    ``(2,2,1)`` -> ``layer2.2.conv1`` (a convolution inside a block); ``(3,3)`` -> ``layer3.3``
    (the output of block 3 of stage 3). Plain module names pass through unchanged.
    """
    if isinstance(address, str):
        match = _ADDRESS.match(address.strip())
        if match is None:
            return address  # already a module name such as "layer4.2.conv3"
        parts = [int(p) for p in match.groups() if p is not None]
    else:
        parts = [int(p) for p in address]
    if len(parts) == 3:
        return f"layer{parts[0]}.{parts[1]}.conv{parts[2]}"
    if len(parts) == 2:
        return f"layer{parts[0]}.{parts[1]}"
    raise ValueError(f"layer address {address!r} must be (stage, block) or (stage, block, conv)")


def resolve_layer(model: nn.Module, address: str | Sequence[int]) -> nn.Module:
    """The module a layer address names, inside a Classifier or a bare backbone."""
    root = model.backbone if isinstance(model, Classifier) else model
    name = layer_name(address)
    modules = dict(root.named_modules())
    if name not in modules:
        convs = [n for n, m in modules.items() if isinstance(m, nn.Conv2d)]
        raise ValueError(f"layer {address!r} ({name}) is not in this model; its convolutions are: "
                         f"{', '.join(convs)}")
    return modules[name]


# ---------------------------------------------------------------- the architectures
def _resnet50(num_classes: int) -> nn.Module:
    return resnet50(weights=None, num_classes=num_classes)


ARCHITECTURES.register(Architecture(
    name="resnet50",
    build_backbone=_resnet50,
    caricature_layers=("(2,2,1)", "(3,0,3)", "(3,2,2)", "(3,3)", "(3,4,3)", "(4,0,3)", "(4,2,3)"),
    gradcam_layer="layer4.2.conv3",
    guided_gradcam_layer="layer4.2.conv3",
    description="torchvision ResNet-50, the paper's model (224x224 ImageNet)",
))


class SmallResNet(ResNet):
    """torchvision's ResNet with Bottleneck blocks, narrow and short, for 32-128 px images on a CPU.

    Same module names as ResNet-50 (layer1..layer4, blocks, conv1..conv3), so layer addresses,
    Grad-CAM targets and checkpoints work identically. The stem is one stride-2 3x3 conv without
    max-pooling: a 64x64 image reaches layer4 at 4x4, as a 224 image reaches 7x7 in ResNet-50.
    """

    def __init__(self, num_classes: int, layers: Sequence[int] = (1, 2, 3, 1),
                 base_width: int = 8, stem_width: int = 8, stem_pool: bool = False,
                 strides: Sequence[int] = (1, 2, 2, 2)):
        # ResNet.__init__ builds with fixed widths 64..512; build it, then replace the body.
        super().__init__(Bottleneck, [1, 1, 1, 1], num_classes=num_classes)
        self.inplanes = stem_width
        self.conv1 = nn.Conv2d(3, stem_width, 3, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(stem_width)
        self.maxpool = nn.MaxPool2d(3, 2, 1) if stem_pool else nn.Identity()
        widths = [base_width * 2 ** i for i in range(4)]
        self.layer1 = self._make_layer(Bottleneck, widths[0], layers[0], stride=strides[0])
        self.layer2 = self._make_layer(Bottleneck, widths[1], layers[1], stride=strides[1])
        self.layer3 = self._make_layer(Bottleneck, widths[2], layers[2], stride=strides[2])
        self.layer4 = self._make_layer(Bottleneck, widths[3], layers[3], stride=strides[3])
        self.fc = nn.Linear(widths[3] * Bottleneck.expansion, num_classes)
        for m in self.modules():  # torchvision's initialisation, applied to the new modules
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)


ARCHITECTURES.register(Architecture(
    name="small_resnet",
    build_backbone=lambda num_classes: SmallResNet(num_classes),
    # Seven layers placed as the paper's are in ResNet-50: early/late stages, early/late blocks,
    # inside and after blocks.
    caricature_layers=("(2,1,1)", "(3,0,3)", "(3,1,2)", "(3,1)", "(3,2,3)", "(4,0,2)", "(4,0,3)"),
    gradcam_layer="layer4.0.conv3",
    guided_gradcam_layer="layer4.0.conv3",
    description="Bottleneck ResNet, blocks (1,2,3,1), widths 8-64 (x4 out), 21 MFLOP per 64x64 image",
))

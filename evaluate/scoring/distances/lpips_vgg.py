"""LPIPS with VGG-16 features, a robustness check in the paper."""
from __future__ import annotations

from torchvision import models

from counteraudit.evaluate.scoring.distances.backbone_weights import Backbone
from counteraudit.evaluate.scoring.distances.base import DISTANCES
from counteraudit.evaluate.scoring.distances.lpips_features import LPIPSDistance


@DISTANCES.register
class LPIPSVGG(LPIPSDistance):
    name = "lpips-vgg"
    torchvision_backbone = Backbone("vgg", models.vgg16, models.VGG16_Weights, "vgg16")
    layer_ends = (4, 9, 16, 23, 30)

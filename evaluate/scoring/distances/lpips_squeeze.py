"""LPIPS with SqueezeNet 1.1 features, a robustness check in the paper."""
from __future__ import annotations

from torchvision import models

from counteraudit.evaluate.scoring.distances.backbone_weights import Backbone
from counteraudit.evaluate.scoring.distances.base import DISTANCES
from counteraudit.evaluate.scoring.distances.lpips_features import LPIPSDistance


@DISTANCES.register
class LPIPSSqueezeNet(LPIPSDistance):
    name = "lpips-squeeze"
    torchvision_backbone = Backbone("squeeze", models.squeezenet1_1, models.SqueezeNet1_1_Weights, "squeezenet1_1")
    layer_ends = (2, 5, 8, 10, 11, 12, 13)

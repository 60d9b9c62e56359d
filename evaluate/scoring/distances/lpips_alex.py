"""LPIPS with AlexNet features: the paper's main-text distance and the default."""
from __future__ import annotations

from torchvision import models

from counteraudit.evaluate.scoring.distances.backbone_weights import Backbone
from counteraudit.evaluate.scoring.distances.base import DISTANCES
from counteraudit.evaluate.scoring.distances.lpips_features import LPIPSDistance


@DISTANCES.register
class LPIPSAlexNet(LPIPSDistance):
    name = "lpips-alex"
    torchvision_backbone = Backbone("alex", models.alexnet, models.AlexNet_Weights, "alexnet")
    layer_ends = (2, 5, 8, 10, 12)

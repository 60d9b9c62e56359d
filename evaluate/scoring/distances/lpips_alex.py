"""LPIPS with AlexNet features: the paper's main-text distance and the default."""
from __future__ import annotations

from counteraudit.evaluate.scoring.distances.base import DISTANCES
from counteraudit.evaluate.scoring.distances.lpips_features import LPIPSDistance


@DISTANCES.register()
class LPIPSAlexNet(LPIPSDistance):
    name = "lpips-alex"
    net = "alex"

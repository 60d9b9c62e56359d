"""LPIPS with SqueezeNet 1.1 features, a robustness check in the paper."""
from __future__ import annotations

from counteraudit.evaluate.scoring.distances.base import DISTANCES
from counteraudit.evaluate.scoring.distances.lpips_features import LPIPSDistance


@DISTANCES.register()
class LPIPSSqueezeNet(LPIPSDistance):
    name = "lpips-squeeze"
    net = "squeeze"

"""The project's own CAM renderer (explain/render.py ``cam_overlay``): a numpy re-implementation of
pytorch-grad-cam's ``show_cam_on_image`` with a JET table and rounding instead of flooring. Every
Grad-CAM result before renderers could be chosen was made with it; ``show_cam_on_image`` is the
library's own call, as the paper's code made it."""
from __future__ import annotations

import numpy as np

from counteraudit.explain.render import RENDERER_VERSION, cam_overlay
from counteraudit.explain.renderers import CAMS, RENDERERS, Renderer


@RENDERERS.register
class JetOverlay(Renderer):
    name = "jet_overlay"
    renders = CAMS
    version = RENDERER_VERSION  # pinned by tests/test_explain_support.py's digest

    def render(self, raw: np.ndarray, images: np.ndarray) -> np.ndarray:
        return cam_overlay(raw, images)

"""pytorch-grad-cam's ``show_cam_on_image(image, cam, use_rgb=True)``, image by image, as the
paper's code rendered Grad-CAM (``visualize/vis_functions.py`` ``get_gradcam``): OpenCV's JET
colour map of ``uint8(255 * cam)``, half and half with the image, divided by its maximum and
floored to uint8; the image's own size."""
from __future__ import annotations

import numpy as np
from pytorch_grad_cam.utils.image import show_cam_on_image

from counteraudit.explain.renderers import CAMS, RENDERERS, Renderer


@RENDERERS.register
class ShowCamOnImage(Renderer):
    name = "show_cam_on_image"
    renders = CAMS

    def render(self, raw: np.ndarray, images: np.ndarray) -> np.ndarray:
        raw = np.asarray(raw, np.float32)
        if raw.ndim != 3:
            raise ValueError(f"expected CAMs (n, H, W), got shape {raw.shape}")
        images = np.asarray(images, np.float32).transpose(0, 2, 3, 1)  # (n, H, W, 3) as the paper
        return np.stack([show_cam_on_image(image, cam, use_rgb=True)
                         for image, cam in zip(images, raw)])

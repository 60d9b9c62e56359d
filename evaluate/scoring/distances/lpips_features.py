"""LPIPS (Zhang et al. 2018) computed from cached features instead of one network call per pair.

LPIPS(a, b) = sum_l mean_{h,w} sum_c w_{l,c} (f_l(a) - f_l(b))^2, where f_l are a backbone's layer
activations normalised to unit length over channels and w_l the linear layers shipped in the
``lpips`` wheel (v0.1). The backbone pass is the only expensive part, so ``features`` runs it once
per image and keeps the normalised activations, each multiplied by sqrt(w_{l,c} / (H_l W_l)): the
shipped weights are non-negative (lpips clamps them in training), so LPIPS becomes a plain sum of
squared differences of the cached tensors and ``paired``/``pairwise`` are cheap arithmetic.
Every step mirrors ``lpips.LPIPS.forward`` (input scaling, ``normalize_tensor``'s eps, layer cuts),
which the tests check to 1e-5 for each backbone.
"""
from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import lpips
import numpy as np
import torch

from counteraudit.evaluate.scoring.distances.backbone_weights import (Backbone, MissingBackboneWeightsError,
                                                                      find_weights_file,
                                                                      load_backbone_features)
from counteraudit.evaluate.scoring.distances.base import Distance, Features, check_images, chunk_length

# lpips.ScalingLayer: maps [-1, 1] inputs to ImageNet-normalised ones.
LPIPS_SHIFT = (-0.030, -0.088, -0.188)
LPIPS_SCALE = (0.458, 0.448, 0.450)
NORMALIZE_EPS = 1e-10  # lpips.normalize_tensor adds it to the channel norm
LPIPS_VERSION = "0.1"
# A few images' difference tensors at a time stay in cache: about 2x faster than one big chunk.
CACHE_FRIENDLY_CHUNK_BYTES = 8 * 2**20
FEATURE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def shipped_linear_weights(net: str, layers: int) -> list[torch.Tensor]:
    """The per-channel weights of lpips's ``layers`` linear layers for ``net``, from the lpips wheel."""
    path = Path(lpips.__file__).parent / "weights" / f"v{LPIPS_VERSION}" / f"{net}.pth"
    state_dict = torch.load(path, map_location="cpu", weights_only=True)
    weights = [state_dict[f"lin{k}.model.1.weight"].reshape(-1).float() for k in range(layers)]
    if any(bool((w < 0).any()) for w in weights):
        raise ValueError(f"{path} has negative linear-layer weights; the cached-feature LPIPS needs the "
                         f"non-negative weights lpips ships (reinstall lpips)")
    return weights


class LPIPSDistance(Distance):
    """Base for the registered ``lpips-<net>`` distances; subclasses only set ``name``, their
    torchvision backbone and the layers lpips taps in it."""

    torchvision_backbone: ClassVar[Backbone]
    # End index (exclusive) in torchvision's ``model.features`` of each slice lpips taps, copied
    # from lpips/pretrained_networks.py (its alexnet, vgg16, squeezenet classes).
    layer_ends: ClassVar[tuple[int, ...]]
    needs_weights: ClassVar[bool] = True

    def __init__(self, weights_dir: str | None = None, *, download: bool = False,
                 random_backbone: bool = False, seed: int = 0, device: str | torch.device = "cpu",
                 batch_size: int = 16, feature_dtype: str = "float32"):
        """``weights_dir``: a folder holding torchvision's weights file (see backbone_weights.py).
        ``random_backbone``: a randomly initialised backbone (seeded), for tests on offline machines;
        never use it for results. ``batch_size``: images per backbone pass. ``feature_dtype``:
        "float32" (exact to lpips) or "float16"/"bfloat16" to halve the cache (float16 changes
        distances by ~1e-3 relative); per render the cache is ~1.9 MB for alex at 224x224, ~24 MB for
        vgg, ~0.13 MB for alex at 64x64 (float32)."""
        if feature_dtype not in FEATURE_DTYPES:
            raise ValueError(f"feature_dtype {feature_dtype!r} is not one of {sorted(FEATURE_DTYPES)}")
        self.feature_dtype = FEATURE_DTYPES[feature_dtype]
        self.device = torch.device(device)
        self.batch_size = int(batch_size)
        self.random_backbone = bool(random_backbone)
        self.backbone = load_backbone_features(self.torchvision_backbone, weights_dir, download,
                                               random_backbone, seed)
        self.backbone.to(self.device)
        self.linear_weights = [w.to(self.device) for w in
                               shipped_linear_weights(self.torchvision_backbone.lpips_net, len(self.layer_ends))]
        self.input_shift = torch.tensor(LPIPS_SHIFT, device=self.device).view(1, 3, 1, 1)
        self.input_scale = torch.tensor(LPIPS_SCALE, device=self.device).view(1, 3, 1, 1)

    @classmethod
    def available(cls, weights_dir: str | None = None, download: bool = False) -> bool:
        try:
            find_weights_file(cls.torchvision_backbone, weights_dir, download)
        except (MissingBackboneWeightsError, NotADirectoryError):
            return False
        return True

    @torch.inference_mode()
    def features(self, images: np.ndarray) -> Features:
        images = check_images(images, self.name, min_size=16)
        per_layer: list[torch.Tensor] = []  # (N, C, h, w) each, allocated once the shapes are known
        for start in range(0, len(images), self.batch_size):
            stop = min(start + self.batch_size, len(images))
            batch = torch.from_numpy(np.ascontiguousarray(images[start:stop]))
            batch = batch.to(self.device).permute(0, 3, 1, 2).float()
            signed = batch / (255.0 / 2.0) - 1.0  # lpips.im2tensor: uint8 -> [-1, 1]
            activation = (signed - self.input_shift) / self.input_scale
            begin = 0
            for layer, end in enumerate(self.layer_ends):
                activation = self.backbone[begin:end](activation)
                begin = end
                if len(per_layer) <= layer:
                    per_layer.append(activation.new_empty((len(images), *activation.shape[1:]),
                                                          dtype=self.feature_dtype))
                height, width = activation.shape[2:]
                # lpips.normalize_tensor, with the lin layer and the spatial mean folded in; written
                # to a new tensor, so later in-place ReLUs cannot alter the cache
                scale = (self.linear_weights[layer] / (height * width)).sqrt().view(1, -1, 1, 1)
                norm = torch.linalg.vector_norm(activation, dim=1, keepdim=True).add_(NORMALIZE_EPS)
                if self.feature_dtype == torch.float32:
                    torch.mul(activation, scale, out=per_layer[layer][start:stop]).div_(norm)
                else:
                    per_layer[layer][start:stop] = activation.mul(scale).div_(norm)
        return Features(self.name, tuple(per_layer), (int(images.shape[1]), int(images.shape[2])))

    @torch.inference_mode()
    def paired(self, features_a: Features, features_b: Features) -> np.ndarray:
        self._check_pair(features_a, features_b)
        count = len(features_a)
        per_image_bytes = sum(t[0].nelement() * t.element_size() for t in features_a.tensors)
        step = chunk_length(per_image_bytes, CACHE_FRIENDLY_CHUNK_BYTES)
        total = torch.zeros(count, dtype=torch.float64)
        for start in range(0, count, step):
            stop = min(start + step, count)
            for layer_a, layer_b in zip(features_a.tensors, features_b.tensors):
                squared = (layer_a[start:stop].float() - layer_b[start:stop].float()).square_()
                total[start:stop] += squared.sum(dim=(1, 2, 3)).double().cpu()
        return total.numpy()

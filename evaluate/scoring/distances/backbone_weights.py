"""Finding torchvision's ImageNet backbone weights for LPIPS on machines that may be offline.

The ``lpips`` wheel ships only its small linear layers; the AlexNet/VGG/SqueezeNet backbones are
torchvision's ImageNet weights. Looked for, in order: the ``weights_dir`` the user gave, then
torch's hub cache ($TORCH_HOME/hub/checkpoints), then, only when asked (``download=True``, the
commands' --download-weights), a download into that cache: nothing reaches for the network
unasked. When they fail, one error names the file, where to put it, and how to fetch it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from urllib.parse import urlparse

import torch


@dataclass(frozen=True)
class Backbone:
    lpips_net: str  # the name lpips uses: alex, vgg, squeeze
    builder: Callable[..., torch.nn.Module]
    weights_enum: type  # torchvision weights enum; its DEFAULT is what lpips's pretrained=True loads
    builder_path: str  # for the fetch command printed in errors

    @property
    def weights(self):
        return self.weights_enum.IMAGENET1K_V1

    @property
    def url(self) -> str:
        return self.weights.url

    @property
    def file_name(self) -> str:
        return Path(urlparse(self.url).path).name  # e.g. alexnet-owt-7be5be79.pth

    @property
    def fetch_command(self) -> str:
        return f"python -c \"import torchvision; torchvision.models.{self.builder_path}(weights='IMAGENET1K_V1')\""


class MissingBackboneWeightsError(FileNotFoundError):
    """The torchvision weights an LPIPS distance needs are not on this machine and cannot be fetched."""


def hub_checkpoints_dir() -> Path:
    return Path(torch.hub.get_dir()) / "checkpoints"  # honours $TORCH_HOME


def candidate_paths(backbone: Backbone, weights_dir: str | os.PathLike | None) -> list[Path]:
    folders = ([Path(weights_dir).expanduser()] if weights_dir else []) + [hub_checkpoints_dir()]
    return [folder / backbone.file_name for folder in folders]


def find_weights_file(backbone: Backbone, weights_dir: str | os.PathLike | None = None,
                      download: bool = False) -> Path:
    """Path of the backbone's weights file, downloading it into the hub cache if asked and possible."""
    if weights_dir is not None and not Path(weights_dir).expanduser().is_dir():
        raise NotADirectoryError(f"weights_dir {str(weights_dir)!r} is not a folder; give the folder "
                                 f"that holds {backbone.file_name}")
    for path in candidate_paths(backbone, weights_dir):
        if path.is_file():
            return path
    download_error = "not downloaded: a download happens only when asked (--download-weights)"
    if download:
        try:
            torch.hub.load_state_dict_from_url(backbone.url, model_dir=str(hub_checkpoints_dir()),
                                               progress=False, map_location="cpu",
                                               weights_only=True)
            path = hub_checkpoints_dir() / backbone.file_name
            if path.is_file():
                return path
            download_error = f"download reported success but {path} is missing"
        except Exception as error:  # offline machines fail here with URLError/OSError
            download_error = f"download failed: {type(error).__name__}: {error}"
    raise MissingBackboneWeightsError(missing_weights_message(backbone, weights_dir, download_error))


def missing_weights_message(backbone: Backbone, weights_dir, reason: str) -> str:
    searched = ", ".join(str(p) for p in candidate_paths(backbone, weights_dir))
    target = Path(weights_dir).expanduser() if weights_dir else hub_checkpoints_dir()
    return (
        f"LPIPS-{backbone.lpips_net} needs torchvision's ImageNet backbone weights file "
        f"{backbone.file_name!r}, which is not here (looked for {searched}; {reason}).\n"
        f"Fix: where there is internet, add --download-weights to the command (download=True), "
        f"which saves it in {hub_checkpoints_dir()}; or, on a machine with internet, run\n"
        f"    {backbone.fetch_command}\n"
        f"which saves ~/.cache/torch/hub/checkpoints/{backbone.file_name} (or get {backbone.url}), "
        f"and copy that file to {target / backbone.file_name} (or into a folder passed as "
        f"--weights-dir / weights_dir, or into $TORCH_HOME/hub/checkpoints).\n"
        f"Or use a weight-free distance (--distance l2 or ssim) instead of LPIPS."
    )


def load_backbone_features(backbone: Backbone, weights_dir=None, download: bool = False,
                           random_backbone: bool = False, seed: int = 0) -> torch.nn.Sequential:
    """The backbone's convolutional ``features`` stack, with ImageNet weights or (tests only) random ones.

    ``random_backbone`` draws the weights as torchvision initialises them after ``torch.manual_seed(seed)``;
    that is what ``lpips.LPIPS(pnet_rand=True)`` builds after the same seed, so the two can be compared.
    """
    if random_backbone:
        with torch.random.fork_rng(devices=[]):  # leave the caller's random stream untouched
            torch.manual_seed(seed)
            model = backbone.builder(weights=None)
    else:
        path = find_weights_file(backbone, weights_dir, download)
        model = backbone.builder(weights=None)
        try:
            state_dict = torch.load(path, map_location="cpu", weights_only=True)
            model.load_state_dict(state_dict)
        except Exception as error:
            raise MissingBackboneWeightsError(
                f"{path} could not be loaded as torchvision {backbone.builder_path} weights "
                f"({type(error).__name__}: {error}); replace it with a fresh copy "
                f"({backbone.fetch_command})") from error
    features = model.features
    features.eval()
    for parameter in features.parameters():
        parameter.requires_grad_(False)
    return features

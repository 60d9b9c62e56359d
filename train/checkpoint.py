"""Where a model's artifacts live, and the one definition of the training checkpoint.

Saving and resuming use the same name (CHECKPOINT_NAME) and the same functions, so a requeued or
interrupted job always resumes from the last finished epoch (a well-known launcher saves
``checkpoint-{epoch}.pth`` but resumes from ``checkpoint.pth`` and silently restarts).

Folder of one model: ``runs/<suite>/models/<name>-<spec key>/``
- ``spec.json``        what determines the weights
- ``checkpoint.pth``   training state after the last finished epoch (model, optimizer, scheduler,
                       epoch, RNG state, history); rewritten atomically once per epoch
- ``weights.pth``      final model weights (what explanations load)
- ``metrics.json``     validation accuracy, timing, implant figures; its presence marks "trained"
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from train.artifacts import atomic_torch_save, read_json
from train.suite import ModelSpec

CHECKPOINT_NAME = "checkpoint.pth"
WEIGHTS_NAME = "weights.pth"
METRICS_NAME = "metrics.json"
SPEC_NAME = "spec.json"
# Epochs between checkpoints. One: a preempted job loses at most one epoch.
CHECKPOINT_EVERY_EPOCHS = 1


def model_dir(suite_root: str | Path, spec: ModelSpec) -> Path:
    return Path(suite_root) / "models" / f"{spec.name}-{spec.key}"


def is_trained(directory: Path) -> bool:
    return (directory / METRICS_NAME).is_file() and (directory / WEIGHTS_NAME).is_file()


def save_training_state(directory: Path, state: dict[str, Any]) -> Path:
    return atomic_torch_save(directory / CHECKPOINT_NAME, state)


def load_training_state(directory: Path) -> dict[str, Any] | None:
    path = directory / CHECKPOINT_NAME
    if not path.is_file():
        return None
    return torch.load(path, map_location="cpu", weights_only=False)


def read_metrics(directory: Path) -> dict[str, Any]:
    return read_json(directory / METRICS_NAME)


# Wrappers that training code or other libraries put around a backbone's parameter names:
# DistributedDataParallel ("module."), robustness / timm-style wrappers ("model."), and ours.
_PREFIXES = ("module.", "model.", "backbone.")


def clean_state_dict(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """A backbone state dict from a checkpoint file in any of the common layouts."""
    for key in ("state_dict", "model", "model_state_dict", "weights"):
        if isinstance(state.get(key), dict):
            state = state[key]
            break
    cleaned = {}
    for name, value in state.items():
        if not torch.is_tensor(value):
            continue
        stripped = True
        while stripped:
            stripped = False
            for prefix in _PREFIXES:
                if name.startswith(prefix):
                    name, stripped = name[len(prefix):], True
        cleaned[name] = value
    return cleaned


def load_backbone_weights(model: torch.nn.Module, path: str | Path) -> None:
    """Load an external checkpoint (ours, torchvision's, DDP-wrapped, robustness-library style)
    into a Classifier's backbone, checking the class count and every parameter name."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"external checkpoint {path} does not exist; give the path to a "
                                ".pth/.pt file holding a ResNet state dict")
    raw = torch.load(path, map_location="cpu", weights_only=False)
    if not isinstance(raw, dict):
        raise ValueError(f"external checkpoint {path} holds a {type(raw).__name__}, "
                         "expected a state dict (or a dict with 'state_dict'/'model')")
    state = clean_state_dict(raw)
    backbone = model.backbone
    fc_weight = state.get("fc.weight")
    expected_classes = backbone.fc.out_features
    if fc_weight is not None and fc_weight.shape[0] != expected_classes:
        raise ValueError(f"external checkpoint {path} has {fc_weight.shape[0]} output classes but "
                         f"this suite's world has {expected_classes}; use a checkpoint trained on "
                         "the same classes")
    own = backbone.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(k for k in set(state) - set(own) if not k.startswith(("normalize", "attacker")))
    if missing or unexpected:
        raise ValueError(f"external checkpoint {path} does not match architecture "
                         f"{getattr(model, 'architecture', '?')}: missing {missing[:5]}"
                         f"{'...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}"
                         f"{'...' if len(unexpected) > 5 else ''}")
    for name, value in own.items():
        if state[name].shape != value.shape:
            raise ValueError(f"external checkpoint {path}: {name} has shape "
                             f"{tuple(state[name].shape)}, the architecture expects {tuple(value.shape)}")
    backbone.load_state_dict({k: state[k] for k in own})

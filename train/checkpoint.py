"""Where a model's artifacts live, and the one definition of the training checkpoint.

Saving and resuming use the same name (CHECKPOINT_NAME) and the same functions, so a requeued or
interrupted job always resumes from the last finished epoch (a well-known launcher saves
``checkpoint-{epoch}.pth`` but resumes from ``checkpoint.pth`` and silently restarts).

Folder of one model, in the store shared by every suite: ``runs/store/models/<spec key>/``
(``runs/<suite>/models/<name>-<spec key>`` links to it; a folder an older version wrote there is
moved into the store the first time a suite needs it)
- ``spec.json``        what determines the weights
- ``checkpoint.pth``   training state after the last finished epoch (model, optimizer, scheduler,
                       epoch, RNG state, history); rewritten atomically once per epoch
- ``weights.pth``      final model weights (what explanations load)
- ``metrics.json``     validation accuracy, timing, and the SHA-256 of ``weights.pth``; its
                       presence marks "trained", and a ``weights.pth`` that does not match it is
                       set aside and made again (from the last epoch's checkpoint: no training)
- ``training.lock``    held while a process trains the model: two runs that need the same model
                       (two suites, say) never train it both; the second waits and reads it
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from counteraudit.train.artifacts import (atomic_torch_save, intact, link_into_store, marker_says,
                                          read_marker, set_aside, store_dir)
from counteraudit.train.suite import ModelSpec, Suite

CHECKPOINT_NAME = "checkpoint.pth"
WEIGHTS_NAME = "weights.pth"
METRICS_NAME = "metrics.json"
SPEC_NAME = "spec.json"
LOCK_NAME = "training.lock"
MODELS = "models"
# Epochs between checkpoints. One: a preempted job loses at most one epoch.
CHECKPOINT_EVERY_EPOCHS = 1


def model_dir(runs_root: str | Path | None, spec: ModelSpec) -> Path:
    """The model's folder in the store of ``runs_root`` (the name is not part of it: two suites
    that name one model differently share it)."""
    return store_dir(runs_root) / MODELS / spec.key


def link_suite_models(suite: Suite, specs: list[ModelSpec], runs_root=None) -> None:
    """``runs/<suite>/models/<name>-<key>`` -> the store, for people browsing a suite's folder; a
    real folder there (an older version's layout) is moved into the store, so it is not retrained."""
    for spec in specs:
        link_into_store(suite.root(runs_root) / MODELS / f"{spec.name}-{spec.key}",
                        model_dir(runs_root, spec), runs_root, marker_says(SPEC_NAME, "key", spec.key))


def is_trained(directory: Path) -> bool:
    """metrics.json is there and readable, and weights.pth matches the digest it records (a
    mismatch is set aside, so the model is made again)."""
    metrics = read_marker(directory / METRICS_NAME, "model metrics")
    return metrics is not None and intact(directory / WEIGHTS_NAME, metrics.get("weights_sha256"),
                                          "model weights")


def save_training_state(directory: Path, state: dict[str, Any]) -> Path:
    return atomic_torch_save(directory / CHECKPOINT_NAME, state)


def load_training_state(directory: Path) -> dict[str, Any] | None:
    """The last saved training state, or None (none yet, or unreadable: set aside, so training
    starts over instead of failing)."""
    path = directory / CHECKPOINT_NAME
    if not path.is_file():
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:  # truncated zip, bad pickle: torch raises several kinds
        set_aside(path, f"{type(error).__name__}: {error}", "training checkpoint")
        return None


def read_metrics(directory: Path) -> dict[str, Any]:
    metrics = read_marker(directory / METRICS_NAME, "model metrics")
    if metrics is None:
        raise FileNotFoundError(f"no readable {directory / METRICS_NAME}: the model is not trained "
                                "yet; run python train/train.py for its suite")
    return metrics


@contextmanager
def training_lock(directory: Path) -> Iterator[None]:
    """Held while this process trains the model in ``directory``. A second process that needs it
    waits here (saying so), then finds it trained. An advisory lock (flock) on a file in the
    model's folder: released by the OS if the process dies, so a killed run never blocks others."""
    import fcntl
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / LOCK_NAME, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"[train] another process is training the model in {directory}; waiting for it",
                  flush=True)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


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

"""Where a model's artifacts live, and the one definition of the training checkpoint.

Saving and resuming use the same name (CHECKPOINT_NAME) and the same functions, so a requeued or
interrupted job always resumes from the last finished epoch (a well-known launcher saves
``checkpoint-{epoch}.pth`` but resumes from ``checkpoint.pth`` and silently restarts).

Folder of one model, in the store shared by every suite: ``runs/store/models/<spec key>/``
(``runs/<suite>/models/<name>-<spec key>`` links to it; a model folder counteraudit wrote there
itself, its marker naming the same key, is moved into the store the first time a suite needs it)
- ``spec.json``        what determines the weights
- ``checkpoint.pth``   training state after the last finished epoch (model, optimizer, scheduler,
                       epoch, RNG state, history); rewritten atomically once per epoch
- ``weights.pth``      final model weights (what explanations load)
- ``metrics.json``     validation accuracy, timing, and the SHA-256 of ``weights.pth``; its
                       presence marks "trained", and a ``weights.pth`` that does not match it is
                       set aside and made again (from the last epoch's checkpoint: no training)
- ``training.lock``    held while a process trains the model: two runs that need the same model
                       (two suites, say) never train it both; the second waits and reads it

Every ``.pth`` is read with ``torch.load(weights_only=True)``: tensors, numbers, strings, lists and
dicts only. A runs folder or a suite's ``checkpoint =`` file may come from a stranger, and
unpickling anything else can run code (a crafted .pth can call ``os.system``). So the training
state holds only such values (``save_training_state`` refuses others), a stored file holding other
objects is set aside and training starts over, and an external checkpoint holding them is refused
with the command that converts a trusted one (train/convert_checkpoint.py).
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch

from counteraudit.train.core.artifacts import (artifact_lock, atomic_torch_save, link_into_store,
                                               marker_says, set_aside, store_dir)
from counteraudit.train.core.keyed_store import KeyedArtifact
from counteraudit.train.core.model_spec import ModelSpec
from counteraudit.train.core.suite import Suite
from counteraudit.train.core.weights import CheckpointNotLoaded, check_plain_values, load_weights_only

CHECKPOINT_NAME = "checkpoint.pth"
WEIGHTS_NAME = "weights.pth"
METRICS_NAME = "metrics.json"
SPEC_NAME = "spec.json"
LOCK_NAME = "training.lock"
MODELS = "models"
# Epochs between checkpoints. One: a preempted job loses at most one epoch.
CHECKPOINT_EVERY_EPOCHS = 1
# What the trainer's resume reads from a training checkpoint (train/trainer.py writes them).
TRAINING_STATE_KEYS = frozenset({"spec_key", "epoch", "model", "optimizer", "scheduler",
                                 "torch_rng", "history", "train_seconds", "images_seen"})
# A trained model: its weights, marked by metrics.json. The folder is named by the model's key, so
# reading does not compare the key metrics.json records (``is_trained`` passes none).
TRAINED_MODEL = KeyedArtifact(payload=WEIGHTS_NAME, marker=METRICS_NAME,
                              digest_field="weights_sha256", what="model weights",
                              marker_what="model metrics",
                              fields={"key": str, "family": str, "val_accuracy": (int, float)})


def model_dir(runs_root: str | Path | None, spec: ModelSpec) -> Path:
    """The model's folder in the store of ``runs_root`` (the name is not part of it: two suites
    that name one model differently share it)."""
    return store_dir(runs_root) / MODELS / spec.key


def link_suite_models(suite: Suite, specs: list[ModelSpec], runs_root=None) -> None:
    """``runs/<suite>/models/<name>-<key>`` -> the store, for people browsing a suite's folder; a
    model folder counteraudit wrote there itself is moved into the store, so it is not retrained."""
    for spec in specs:
        link_into_store(suite.root(runs_root) / MODELS / f"{spec.name}-{spec.key}",
                        model_dir(runs_root, spec), runs_root, marker_says(SPEC_NAME, "key", spec.key))


def is_trained(directory: Path) -> bool:
    """metrics.json is there and readable, and weights.pth matches the digest it records (a
    mismatch is set aside, so the model is made again)."""
    return TRAINED_MODEL.is_stored(directory)


def save_trained_model(directory: Path, backbone: torch.nn.Module,
                       metrics: dict[str, Any]) -> dict[str, Any]:
    """weights.pth, then metrics.json (``metrics`` with the weights' SHA-256), which marks the
    model as trained; returns what metrics.json holds."""
    return TRAINED_MODEL.save(directory, metrics["key"],
                              lambda path: atomic_torch_save(path, backbone.state_dict()), metrics)


def save_training_state(directory: Path, state: dict[str, Any]) -> Path:
    check_plain_values(state, "state")
    return atomic_torch_save(directory / CHECKPOINT_NAME, state)


def load_training_state(directory: Path) -> dict[str, Any] | None:
    """The last saved training state, or None: none yet, or unreadable (truncated, not a
    checkpoint, not a training state, or holding Python objects beyond tensors, as a planted file
    may: never unpickled). An unreadable one is set aside, so training starts over instead of
    failing. Checkpoints of earlier versions hold only tensors and plain values: they resume."""
    path = directory / CHECKPOINT_NAME
    if not path.is_file():
        return None
    try:
        state = load_weights_only(path)
    except CheckpointNotLoaded as error:
        set_aside(path, f"{error.problem}; training starts over from the first epoch",
                  "training checkpoint")
        return None
    missing = TRAINING_STATE_KEYS - set(state) if isinstance(state, dict) else TRAINING_STATE_KEYS
    if missing or not torch.is_tensor(state["torch_rng"]):
        absent = ", ".join(sorted(missing)) or "RNG state"
        set_aside(path, f"it holds no training state (no {absent}); training starts over from the "
                        "first epoch", "training checkpoint")
        return None
    if not finite_weights(state["model"]):  # training never saves these; a planted file may hold them
        set_aside(path, "its weights hold inf or nan (the training diverged); training starts over "
                        "from the first epoch", "training checkpoint")
        return None
    return state


def finite_weights(state_dict: dict[str, Any]) -> bool:
    """Whether every floating-point tensor of a state dict is finite (no inf, no nan)."""
    return all(bool(torch.isfinite(value).all()) for value in state_dict.values()
               if torch.is_tensor(value) and value.is_floating_point())


def read_metrics(directory: Path) -> dict[str, Any]:
    return TRAINED_MODEL.require_marker(directory, f"the model in {directory} is not trained "
                                                   "yet; run python train/train.py for its suite")


def trained_metrics(specs: list[ModelSpec], runs_root=None) -> dict[str, dict[str, Any]]:
    """Each trained model's metrics.json (accuracy, numerics, ...), by the name the suite gives it."""
    directories = {spec.name: model_dir(runs_root, spec) for spec in specs}
    return {name: read_metrics(directory) for name, directory in directories.items()
            if is_trained(directory)}


def training_lock(directory: Path) -> AbstractContextManager[None]:
    """Held while this process trains the model in ``directory``. A second process that needs it
    waits here (saying so), then finds it trained (``artifact_lock`` on the model's
    ``training.lock``: released by the OS if the process dies, so a killed run never blocks others)."""
    return artifact_lock(directory, LOCK_NAME, "train", f"training the model in {directory}")
